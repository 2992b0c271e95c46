"""Fixtures for the dashboard tests: a tiny random Llama (no tokenizer: tokens show as <id>, as with the
arch: shapes), a draft for it, and a dashboard over it."""

from __future__ import annotations

import pytest
from app_helpers import tiny_llama

from explorer.app import Dashboard


@pytest.fixture(scope="module")
def tiny():
    return tiny_llama("tiny", seed=0)


@pytest.fixture(scope="module")
def tiny_draft():
    return tiny_llama("tiny-draft", seed=1, hidden=32, layers=1)


@pytest.fixture
def dash(tiny):
    d = Dashboard(lm=tiny, prompt="Hello there", measure_peaks=False, max_new_tokens=None)
    yield d
    d.pause()
    d.wait(10)
