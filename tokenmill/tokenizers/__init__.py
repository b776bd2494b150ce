"""Tokenizers and encoders: the tokenizer's facts, the pretrained and tiktoken ones, the encoders a run chooses
among and the reference they are checked against, and the chat templates (conversations, preference pairs)
rendered as the model's own."""
