"""The parts of scripts/train_bundled.py, one idea each (as nanoGPT splits its own): settings,
corpus, tokenizer, model, training loop and model card. The script wires them together."""
