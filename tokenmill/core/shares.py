"""A mixture's shares: the tokens drawn from each source given the tokens each has (budgets, epochs, weights of
`mix.total_tokens`), used by the mix stage on the tokens made and by the sample stage, before there are tokens,
on the input's bytes."""

from __future__ import annotations

from tokenmill.config import TokenmillConfig


class MixError(ValueError):
    """A mixture whose targets the tokens made cannot meet (the message names the source and the numbers)."""


def draw(config: TokenmillConfig, available: dict[str, float]) -> dict[str, float]:
    """The training tokens drawn from each source, given the tokens each has (`available`): budgets and epochs
    as given, the weighted sources sharing the rest of `mix.total_tokens` by weight, or with no total the most
    they can without repeating (the scarcest by weight drawn once)."""
    total_tokens = config.mix.total_tokens
    drawn = {s.name: s.tokens or s.epochs * available[s.name] for s in config.sources if s.weight is None}
    weighted = {s.name: s.weight for s in config.sources if s.weight is not None}
    if not weighted:
        return drawn
    if total_tokens is not None:
        left = total_tokens - sum(drawn.values())
        if left <= 0:
            raise MixError(
                f"the budgets and epochs of {', '.join(drawn)} draw {sum(drawn.values()):,.0f} tokens, "
                f"mix.total_tokens is {total_tokens:,}: nothing is left for {', '.join(weighted)}"
            )
    else:
        left = min(available[n] * sum(weighted.values()) / w for n, w in weighted.items())
    return drawn | {n: left * w / sum(weighted.values()) for n, w in weighted.items()}


# The tokenizer's training sample is drawn before there are tokens: its sources' shares are the mix's over their
# input bytes, a budget in tokens counted as this many bytes (about English text's with a 32k-50k vocabulary).
BYTES_PER_TOKEN = 4


def sample_shares(config: TokenmillConfig, source_bytes: dict[str, int]) -> dict[str, float]:
    """Each source's share of the tokenizer's training sample: its share of the mix, estimated from its bytes."""
    drawn = draw(config, {name: nbytes / BYTES_PER_TOKEN for name, nbytes in source_bytes.items()})
    return {name: tokens / sum(drawn.values()) for name, tokens in drawn.items()}


def target_text(target: dict) -> str:
    """A source's target (a manifest's `{"kind", "value"}`) as the config gave it: `weight 0.6`, `epochs 2.5`,
    `tokens 50,000,000` (a budget as the count it is, not `5e+07`)."""
    value = target["value"]
    return f"{target['kind']} {value:,}" if target["kind"] == "tokens" else f"{target['kind']} {value:g}"
