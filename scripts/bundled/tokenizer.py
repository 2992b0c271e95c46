"""The tokenizer: a byte-level BPE trained on the corpus, and the corpus cut into token rows."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from scripts.bundled.settings import TARGET_SPEC

BOS_EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"


def train_tokenizer(docs: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer and wrap it for transformers.

    ``<|endoftext|>`` is bos and eos (GPT-2 style: documents are separated by
    it, and the tokenizer prepends it to every encoded text so a prompt starts
    the way every training document does); ``<|pad|>`` is a separate padding
    token so attention masks stay visible.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[BOS_EOS_TOKEN, PAD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer=trainer)
    bos_id = tok.token_to_id(BOS_EOS_TOKEN)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS_EOS_TOKEN} $A",
        pair=f"{BOS_EOS_TOKEN} $A {BOS_EOS_TOKEN} $B",
        special_tokens=[(BOS_EOS_TOKEN, bos_id)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS_EOS_TOKEN,
        eos_token=BOS_EOS_TOKEN,
        pad_token=PAD_TOKEN,
        model_max_length=TARGET_SPEC.max_position_embeddings,
        clean_up_tokenization_spaces=False,
    )


def encode_stream(tokenizer: PreTrainedTokenizerFast, docs: list[str]) -> torch.Tensor:
    """Token ids of all documents, each preceded by ``<|endoftext|>``, plus a final one."""
    ids: list[int] = []
    for encoding in tokenizer.backend_tokenizer.encode_batch(docs):
        ids.extend(encoding.ids)  # the post-processor prepends <|endoftext|>
    ids.append(tokenizer.eos_token_id)
    return torch.tensor(ids, dtype=torch.long)


def chunk_sequences(stream: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Cut a token stream into non-overlapping rows of ``seq_len`` tokens."""
    rows = stream.numel() // seq_len
    return stream[: rows * seq_len].view(rows, seq_len)
