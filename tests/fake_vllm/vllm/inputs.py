"""Prompt types: the worker sends token ids, never text."""
from typing import TypedDict


class TokensPrompt(TypedDict):
    prompt_token_ids: list[int]
