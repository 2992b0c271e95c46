"""The corpus: Python's reference topics and the docstrings of a fixed list of standard-library
modules, cleaned, deduplicated and split into train and validation documents."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import io
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from explorer.model.corpus import (
    clean_text,
    is_validation_doc,
    pydoc_topic_documents,
    split_paragraph_groups,
)

# A fixed, sorted list of standard-library modules whose docstrings join the
# corpus.  Modules that fail to import on a given platform / Python version are
# skipped (and listed in training.json).  Modules with import-time side effects
# (antigravity, this, tkinter, turtle, idlelib, ...) and the boilerplate codec
# modules under ``encodings`` are left out on purpose.
STDLIB_MODULES: tuple[str, ...] = tuple(
    sorted(
        """
abc argparse array ast asyncio asyncio.base_events asyncio.coroutines
asyncio.events asyncio.exceptions asyncio.futures asyncio.locks
asyncio.protocols asyncio.queues asyncio.runners asyncio.streams
asyncio.subprocess asyncio.taskgroups asyncio.tasks asyncio.threads
asyncio.timeouts asyncio.transports atexit base64 bdb binascii bisect
builtins bz2 cProfile calendar cmath cmd code codecs codeop collections
collections.abc colorsys compileall concurrent.futures configparser
contextlib contextvars copy copyreg csv ctypes ctypes.util dataclasses
datetime dbm dbm.dumb decimal difflib dis doctest email email.charset
email.contentmanager email.encoders email.errors email.feedparser
email.generator email.header email.headerregistry email.iterators
email.message email.parser email.policy email.utils enum errno faulthandler
filecmp fileinput fnmatch fractions ftplib functools gc genericpath getopt
getpass gettext glob graphlib gzip hashlib heapq hmac html html.entities
html.parser http http.client http.cookiejar http.cookies http.server imaplib
importlib importlib.abc importlib.machinery importlib.metadata
importlib.resources importlib.util inspect io ipaddress itertools json
json.decoder json.encoder keyword linecache locale logging logging.config
logging.handlers lzma mailbox marshal math mimetypes mmap modulefinder
multiprocessing multiprocessing.connection multiprocessing.context
multiprocessing.managers multiprocessing.pool multiprocessing.process
multiprocessing.queues multiprocessing.shared_memory
multiprocessing.sharedctypes multiprocessing.synchronize netrc ntpath
numbers opcode operator optparse os os.path pathlib pdb pickle pickletools
pkgutil platform plistlib poplib posixpath pprint profile pstats pty
py_compile pyclbr pydoc queue quopri random re reprlib rlcompleter runpy
sched secrets select selectors shelve shlex shutil signal site smtplib socket
socketserver sqlite3 ssl stat statistics string stringprep struct subprocess
symtable sys sysconfig tabnanny tarfile tempfile textwrap threading time
timeit token tokenize tomllib trace traceback tracemalloc types typing
unicodedata unittest unittest.case unittest.loader unittest.mock
unittest.result unittest.runner unittest.suite urllib.error urllib.parse
urllib.request urllib.response urllib.robotparser uuid warnings wave weakref
webbrowser wsgiref.handlers wsgiref.headers wsgiref.simple_server
wsgiref.util wsgiref.validate xml.dom xml.dom.minidom xml.etree.ElementTree
xml.parsers.expat xml.sax xml.sax.handler xml.sax.saxutils xmlrpc.client
xmlrpc.server zipapp zipfile zipimport zlib zoneinfo
""".split()
    )
)


@dataclass
class Corpus:
    """The documents of the corpus, split into train and validation."""

    train_docs: list[str]
    val_docs: list[str]
    sources: dict[str, Any] = field(default_factory=dict)

    @property
    def num_chars(self) -> int:
        return sum(len(d) for d in self.train_docs) + sum(len(d) for d in self.val_docs)


def import_quietly(name: str) -> Any:
    """Import a module while swallowing anything it prints or warns."""
    with (
        warnings.catch_warnings(),
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()),
    ):
        warnings.simplefilter("ignore")
        return importlib.import_module(name)


def public_members(obj: Any) -> Iterator[tuple[str, Any]]:
    """Public attributes of a module or class, sorted by name."""
    try:
        names = sorted(vars(obj))
    except TypeError:
        return
    for name in names:
        if name.startswith("_"):
            continue
        try:
            yield name, getattr(obj, name)
        except Exception:  # noqa: BLE001 - attribute access may raise anything
            continue


def documented_objects(module: Any) -> Iterator[Any]:
    """The module, then its public functions/classes and the classes' methods."""
    yield module
    for _, obj in public_members(module):
        if not (inspect.isclass(obj) or inspect.isroutine(obj)):
            continue
        if (
            getattr(obj, "__module__", None) not in (module.__name__, None)
            and module.__name__ != "builtins"
        ):
            continue  # re-exported from elsewhere: documented at its home
        yield obj
        if inspect.isclass(obj):
            for _, member in public_members(obj):
                if inspect.isroutine(member) or isinstance(member, property):
                    yield member


def safe_getdoc(obj: Any) -> str | None:
    """``inspect.getdoc`` that never raises."""
    try:
        return inspect.getdoc(obj)
    except Exception:  # noqa: BLE001
        return None


def stdlib_docstring_documents(modules: Iterable[str]) -> tuple[list[str], list[str]]:
    """Docstrings of the given modules' public API; returns (documents, failed modules)."""
    docs: list[str] = []
    failed: list[str] = []
    with warnings.catch_warnings():  # deprecated aliases warn on attribute access
        warnings.simplefilter("ignore")
        for name in modules:
            docs.extend(module_docstrings(name, failed))
    return docs, failed


def module_docstrings(name: str, failed: list[str]) -> list[str]:
    """Documents from one module; appends ``name`` to ``failed`` if it cannot be imported."""
    try:
        module = import_quietly(name)
    except Exception:  # noqa: BLE001 - platform-specific modules
        failed.append(name)
        return []
    docs: list[str] = []
    for obj in documented_objects(module):
        doc = safe_getdoc(obj)
        if doc and len(doc) >= 40:
            docs.extend(split_paragraph_groups(clean_text(doc)))
    return docs


def deduplicate(docs: Iterable[str]) -> list[str]:
    """Drop exact duplicates (inherited docstrings), keeping first occurrences."""
    seen: set[str] = set()
    unique: list[str] = []
    for doc in docs:
        if doc and doc not in seen:
            seen.add(doc)
            unique.append(doc)
    return unique


def build_corpus(val_fraction: float) -> Corpus:
    """Collect, clean, deduplicate and split the offline corpus."""
    topic_docs = pydoc_topic_documents()
    doc_docs, failed = stdlib_docstring_documents(STDLIB_MODULES)
    docs = deduplicate(topic_docs + doc_docs)
    train = [d for d in docs if not is_validation_doc(d, val_fraction)]
    val = [d for d in docs if is_validation_doc(d, val_fraction)]
    sources = {
        "pydoc_data_topics": {
            "documents": len(topic_docs),
            "characters": sum(map(len, topic_docs)),
        },
        "stdlib_docstrings": {
            "modules_requested": len(STDLIB_MODULES),
            "modules_failed": failed,
            "documents": len(doc_docs),
            "characters": sum(map(len, doc_docs)),
        },
        "documents_after_dedup": len(docs),
    }
    return Corpus(train_docs=train, val_docs=val, sources=sources)
