"""Unit tests of the pure pricing engine: converters, genai-prices pricing, the operator price file.

Every expected cost is computed here from per-million-token prices stated in a comment, never taken
from the code under test.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import genai_prices
import pytest
from genai_prices import Usage, calc_price
from genai_prices.data_snapshot import get_snapshot

from commonos.accounting.pricing import (
    CostStatus,
    PriceFile,
    PriceFileError,
    Pricer,
    PriceResult,
    load_price_file,
)
from commonos.accounting.usage import (
    TokenUsage,
    UsageError,
    from_anthropic_usage,
    from_codex_usage,
    from_openai_usage,
)

MTOK = Decimal(1_000_000)
AT = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def usd(*token_price_pairs: tuple[int, str]) -> Decimal:
    """Sum of tokens x USD-per-million, exact, quantized like the engine (1e-10 USD)."""
    total = sum((Decimal(tokens) * Decimal(price) for tokens, price in token_price_pairs), Decimal(0))
    return (total / MTOK).quantize(Decimal("1e-10"))


@pytest.fixture(scope="module")
def pricer() -> Pricer:
    return Pricer()


def write_price_file(tmp_path: Path, text: str, name: str = "prices.toml") -> PriceFile:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return load_price_file(path)


# --- converters ------------------------------------------------------------------------------------------


def test_from_anthropic_usage_splits_cache_writes_by_ttl() -> None:
    usage = from_anthropic_usage(
        {
            "input_tokens": 1200,
            "cache_read_input_tokens": 50_000,
            "cache_creation_input_tokens": 7000,
            "cache_creation": {"ephemeral_5m_input_tokens": 3000, "ephemeral_1h_input_tokens": 4000},
            "output_tokens": 900,
            "service_tier": "standard",
        }
    )
    assert usage == TokenUsage(
        input_tokens=1200,
        cache_read_tokens=50_000,
        cache_write_5m_tokens=3000,
        cache_write_1h_tokens=4000,
        output_tokens=900,
        service_tier="standard",
    )
    assert usage.total_input_tokens == 1200 + 50_000 + 7000


def test_from_anthropic_usage_without_ttl_breakdown_is_all_5m() -> None:
    usage = from_anthropic_usage({"input_tokens": 10, "cache_creation_input_tokens": 500, "output_tokens": 1})
    assert (usage.cache_write_5m_tokens, usage.cache_write_1h_tokens) == (500, 0)


def test_from_anthropic_usage_rejects_1h_larger_than_total() -> None:
    with pytest.raises(UsageError, match=r"ephemeral_1h_input_tokens \(600\) cannot exceed"):
        from_anthropic_usage(
            {
                "input_tokens": 1,
                "output_tokens": 1,
                "cache_creation_input_tokens": 500,
                "cache_creation": {"ephemeral_1h_input_tokens": 600},
            }
        )


def test_from_openai_chat_usage_subtracts_cached_and_keeps_reasoning_in_output() -> None:
    usage = from_openai_usage(
        {
            "prompt_tokens": 12_000,
            "completion_tokens": 3000,
            "total_tokens": 15_000,
            "prompt_tokens_details": {"cached_tokens": 8000, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 2000, "audio_tokens": 0},
        },
        service_tier="default",
    )
    assert usage == TokenUsage(
        input_tokens=4000,
        cache_read_tokens=8000,
        output_tokens=3000,
        reasoning_tokens=2000,
        service_tier="default",
    )


def test_from_openai_responses_usage() -> None:
    usage = from_openai_usage(
        {
            "input_tokens": 5000,
            "input_tokens_details": {"cached_tokens": 1000},
            "output_tokens": 700,
            "output_tokens_details": {"reasoning_tokens": 600},
            "total_tokens": 5700,
        }
    )
    assert usage == TokenUsage(input_tokens=4000, cache_read_tokens=1000, output_tokens=700, reasoning_tokens=600)


def test_from_openai_usage_tolerates_null_details() -> None:
    usage = from_openai_usage({"prompt_tokens": 10, "completion_tokens": 2, "prompt_tokens_details": None})
    assert usage == TokenUsage(input_tokens=10, output_tokens=2)


def test_from_codex_usage() -> None:
    usage = from_codex_usage(
        {
            "input_tokens": 24_000,
            "cached_input_tokens": 20_000,
            "output_tokens": 1500,
            "reasoning_output_tokens": 1100,
            "total_tokens": 25_500,
        }
    )
    assert usage == TokenUsage(input_tokens=4000, cache_read_tokens=20_000, output_tokens=1500, reasoning_tokens=1100)


def test_usage_rejects_reasoning_outside_output() -> None:
    with pytest.raises(UsageError, match="reasoning_tokens"):
        TokenUsage(output_tokens=10, reasoning_tokens=11)


def test_usage_rejects_negative_counts() -> None:
    with pytest.raises(UsageError, match="input_tokens"):
        from_codex_usage({"input_tokens": -1})


# --- genai-prices ----------------------------------------------------------------------------------------


def test_anthropic_with_cache_read_and_both_cache_writes(pricer: Pricer) -> None:
    usage = from_anthropic_usage(
        {
            "input_tokens": 1200,
            "cache_read_input_tokens": 50_000,
            "cache_creation_input_tokens": 7000,
            "cache_creation": {"ephemeral_5m_input_tokens": 3000, "ephemeral_1h_input_tokens": 4000},
            "output_tokens": 900,
        }
    )
    result = pricer.price("anthropic", "claude-sonnet-4-5-20250929", usage, AT)
    # Claude Sonnet 4.5 (<= 200k input): $3 input, $0.30 cache read, $3.75 5m write, $6 1h write, $15 output.
    expected = usd((1200, "3"), (50_000, "0.30"), (3000, "3.75"), (4000, "6"), (900, "15"))
    assert result.cost_usd == expected == Decimal("0.0673500000")
    assert result.status is CostStatus.PRICED
    assert result.source == "genai-prices"
    # The installed release and its bundled data (the range in pyproject.toml lets setup take a newer one).
    assert result.version.startswith(f"genai-prices {genai_prices.__version__}+data.")
    assert result.detail == "anthropic/claude-sonnet-4-5"


def test_claude_code_prices_as_anthropic_and_long_context_tier_uses_total_input(pricer: Pricer) -> None:
    # Only 10k uncached input, but 250k in total with the cache read: over the 200k tier, every bucket
    # pays the long-context price: $6 input, $0.60 cache read, $7.50 5m write, $22.50 output.
    usage = TokenUsage(input_tokens=10_000, cache_read_tokens=230_000, cache_write_5m_tokens=10_000, output_tokens=2000)
    result = pricer.price("claude-code", "claude-sonnet-4-5", usage, AT)
    assert result.cost_usd == usd((10_000, "6"), (230_000, "0.60"), (10_000, "7.50"), (2000, "22.50"))


def test_openai_cached_input_and_reasoning_not_double_counted(pricer: Pricer) -> None:
    usage = from_openai_usage(
        {
            "prompt_tokens": 12_000,
            "completion_tokens": 3000,
            "prompt_tokens_details": {"cached_tokens": 8000},
            "completion_tokens_details": {"reasoning_tokens": 2000},
        }
    )
    result = pricer.price("openai", "o4-mini", usage, AT)
    # o4-mini: $1.10 input, $0.275 cached input, $4.40 output. Reasoning (2000) is inside the 3000 output.
    assert result.cost_usd == usd((4000, "1.10"), (8000, "0.275"), (3000, "4.40")) == Decimal("0.0198000000")
    assert result.status is CostStatus.PRICED


def test_codex_usage_record(pricer: Pricer) -> None:
    usage = from_codex_usage(
        {
            "input_tokens": 24_000,
            "cached_input_tokens": 20_000,
            "output_tokens": 1500,
            "reasoning_output_tokens": 1100,
        }
    )
    result = pricer.price("codex", "gpt-5-codex", usage, AT)
    # gpt-5-codex is priced as GPT-5: $1.25 input, $0.125 cached input, $10 output.
    assert result.cost_usd == usd((4000, "1.25"), (20_000, "0.125"), (1500, "10")) == Decimal("0.0225000000")
    assert result.detail == "openai/gpt-5"


def test_real_price_change_on_a_date(pricer: Pricer) -> None:
    usage = TokenUsage(input_tokens=100_000, output_tokens=10_000)
    # OpenAI cut o3 on 2025-06-10 from $10 input / $40 output to $2 input / $8 output (UTC date of the call).
    before = pricer.price("openai", "o3", usage, datetime(2025, 6, 9, 23, 59, tzinfo=UTC))
    after = pricer.price("openai", "o3", usage, datetime(2025, 6, 10, 0, 0, tzinfo=UTC))
    assert before.cost_usd == usd((100_000, "10"), (10_000, "40")) == Decimal("1.4000000000")
    assert after.cost_usd == usd((100_000, "2"), (10_000, "8")) == Decimal("0.2800000000")


def test_service_tier_selects_the_price_variant(pricer: Pricer) -> None:
    usage = TokenUsage(input_tokens=1_000_000, output_tokens=1_000_000)
    # gpt-4.1: $2 / $8 standard; priority tier from 2026-10-12: $3.50 / $14.
    at = datetime(2026, 11, 1, tzinfo=UTC)
    standard = pricer.price("openai", "gpt-4.1", usage, at)
    priority = pricer.price(
        "openai",
        "gpt-4.1",
        TokenUsage(input_tokens=1_000_000, output_tokens=1_000_000, service_tier="priority"),
        at,
    )
    assert standard.cost_usd == Decimal("10.0000000000")
    assert priority.cost_usd == Decimal("17.5000000000")


def test_anthropic_batch_and_fast_mode_select_their_variants(pricer: Pricer) -> None:
    at = datetime(2026, 11, 1, tzinfo=UTC)
    batch = from_anthropic_usage({"input_tokens": 1_000_000, "output_tokens": 1_000_000, "service_tier": "batch"})
    fast = from_anthropic_usage({"input_tokens": 1_000_000, "output_tokens": 1_000_000, "speed": "fast"})
    # Claude Haiku 4.5 batch (from 2026-10-14): $0.50 / $2.50. Claude Opus 4.8 fast mode: $10 / $50.
    assert pricer.price("anthropic", "claude-haiku-4-5", batch, at).cost_usd == Decimal("3.0000000000")
    assert pricer.price("anthropic", "claude-opus-4-8", fast, at).cost_usd == Decimal("60.0000000000")


def test_naive_timestamp_is_utc(pricer: Pricer) -> None:
    usage = TokenUsage(input_tokens=1_000_000)
    assert pricer.price("openai", "o3", usage, datetime(2025, 6, 9, 23, 0)).cost_usd == Decimal("10.0000000000")


@pytest.mark.parametrize(
    ("provider", "model"),
    [
        ("openai", "gpt-99-imaginary"),
        ("anthropic", "not-a-claude"),
        ("no-such-vendor", "x"),
        ("scripted", "echo"),
    ],
)
def test_unknown_model_is_unpriced(pricer: Pricer, provider: str, model: str) -> None:
    result = pricer.price(provider, model, TokenUsage(input_tokens=10, output_tokens=10), AT)
    assert result.cost_usd is None
    assert result.status is CostStatus.UNPRICED
    assert result.detail


def test_model_without_token_prices_is_unpriced(pricer: Pricer) -> None:
    # gpt-live-1 is priced per audio hour; token usage cannot price it.
    result = pricer.price("openai", "gpt-live-1", TokenUsage(input_tokens=10), AT)
    assert (result.status, result.cost_usd) == (CostStatus.UNPRICED, None)
    assert "no token prices" in result.detail


def test_reported_cost_when_model_unknown(pricer: Pricer) -> None:
    result = pricer.price("openai", "gpt-99-imaginary", TokenUsage(), AT, reported_cost_usd=Decimal("0.012345"))
    assert result == PriceResult(
        cost_usd=Decimal("0.0123450000"),
        status=CostStatus.REPORTED,
        source="reported",
        version="",
        detail="Unable to find model with model_ref='gpt-99-imaginary' in openai",
    )


def test_known_model_ignores_reported_cost(pricer: Pricer) -> None:
    result = pricer.price("openai", "o4-mini", TokenUsage(input_tokens=1000), AT, reported_cost_usd=Decimal(5))
    assert (result.status, result.cost_usd) == (CostStatus.PRICED, usd((1000, "1.10")))


def test_estimated_usage_marks_the_cost(pricer: Pricer) -> None:
    usage = TokenUsage(input_tokens=1000, output_tokens=1000, usage_estimated=True)
    result = pricer.price("anthropic", "claude-haiku-4-5", usage, AT)
    # Claude Haiku 4.5: $1 input, $5 output.
    assert (result.status, result.source, result.cost_usd) == (
        CostStatus.ESTIMATED,
        "genai-prices",
        usd((1000, "1"), (1000, "5")),
    )


def _genai_usage(usage: TokenUsage) -> Usage:
    """The same call in genai-prices' convention: input_tokens is the total input."""
    return Usage(
        input_tokens=usage.total_input_tokens,
        cache_read_tokens=usage.cache_read_tokens,
        cache_write_tokens=usage.cache_write_5m_tokens + usage.cache_write_1h_tokens,
        cache_write_5m_tokens=usage.cache_write_5m_tokens,
        cache_write_1h_tokens=usage.cache_write_1h_tokens,
        output_tokens=usage.output_tokens,
        output_reasoning_tokens=usage.reasoning_tokens,
    )


@pytest.mark.parametrize("provider_id", ["anthropic", "openai"])
@pytest.mark.parametrize("service_tier", [None, "priority", "flex", "batch"])
def test_fast_path_agrees_with_genai_prices_calc_price(provider_id: str, service_tier: str | None) -> None:
    """Our cached per-token rates give what genai_prices.calc_price gives, for every token-priced model."""
    pricer = Pricer()
    provider = next(p for p in get_snapshot().providers if p.id == provider_id)
    calls = [
        TokenUsage(
            input_tokens=1234,
            cache_read_tokens=5678,
            cache_write_5m_tokens=91,
            cache_write_1h_tokens=23,
            output_tokens=4567,
            reasoning_tokens=1000,
            service_tier=service_tier,
        ),
        TokenUsage(
            input_tokens=150_000,
            cache_read_tokens=100_000,
            cache_write_5m_tokens=10_000,
            cache_write_1h_tokens=3000,
            output_tokens=20_000,
            service_tier=service_tier,
        ),
    ]
    context = (
        {"processing": "batch"} if service_tier == "batch" else {"service_tier": service_tier} if service_tier else None
    )
    compared = 0
    for model in provider.models:
        for at in (datetime(2025, 1, 1, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC)):
            for usage in calls:
                result = pricer.price(provider_id, model.id, usage, at)
                if result.status is CostStatus.UNPRICED:
                    continue
                expected = calc_price(
                    _genai_usage(usage),
                    model.id,
                    provider_id=provider_id,
                    genai_request_timestamp=at,
                    price_context=context,
                ).total_price
                # genai-prices also bills web searches etc.; our usage has none, so totals must match.
                assert result.cost_usd == expected.quantize(Decimal("1e-10")), (model.id, at, usage)
                compared += 1
    assert compared > 50


# --- operator price file ---------------------------------------------------------------------------------


PRICE_FILE = """
[[price]]
provider = "anthropic"
model = "claude-sonnet-4-5"
input_mtok = "2.00"
output_mtok = 10
cache_read_mtok = 0.20
cache_write_5m_mtok = "2.50"
cache_write_1h_mtok = "4.00"

[[price]]
model = "local-llama-*"
input_mtok = "0.10"
output_mtok = "0.20"

[[price]]
provider = "scripted"
model = "echo"
effective_from = 2026-01-01
input_mtok = "1"
output_mtok = "1"

[[price]]
provider = "scripted"
model = "echo"
effective_from = 2026-03-01
input_mtok = "2"
output_mtok = "3"
"""


def test_override_file_replaces_genai_prices(tmp_path: Path) -> None:
    pricer = Pricer(write_price_file(tmp_path, PRICE_FILE))
    usage = TokenUsage(
        input_tokens=1000,
        cache_read_tokens=10_000,
        cache_write_5m_tokens=2000,
        cache_write_1h_tokens=3000,
        output_tokens=500,
    )
    result = pricer.price("claude-code", "claude-sonnet-4-5", usage, AT)
    # The file's prices: $2 input, $0.20 cache read, $2.50 5m write, $4 1h write, $10 output.
    assert result.cost_usd == usd((1000, "2"), (10_000, "0.20"), (2000, "2.50"), (3000, "4"), (500, "10"))
    assert result.status is CostStatus.OVERRIDE
    assert result.source == "override:prices.toml"
    assert len(result.version) == 12
    # Another Anthropic model is not in the file: genai-prices still prices it.
    assert pricer.price("anthropic", "claude-haiku-4-5", usage, AT).status is CostStatus.PRICED


def test_override_glob_without_provider_prices_unknown_models(tmp_path: Path) -> None:
    pricer = Pricer(write_price_file(tmp_path, PRICE_FILE))
    usage = TokenUsage(input_tokens=1_000_000, cache_read_tokens=1_000_000, output_tokens=1_000_000)
    result = pricer.price("ollama", "Local-Llama-3.1-8B", usage, AT)
    # $0.10 input; no cache-read price, so cached input pays the input price; $0.20 output.
    assert result.cost_usd == usd((1_000_000, "0.10"), (1_000_000, "0.10"), (1_000_000, "0.20"))
    assert result.status is CostStatus.OVERRIDE


def test_override_price_change_on_a_date(tmp_path: Path) -> None:
    pricer = Pricer(write_price_file(tmp_path, PRICE_FILE))
    usage = TokenUsage(input_tokens=1_000_000, output_tokens=1_000_000)
    # scripted/echo: nothing before 2026-01-01, $1/$1 from then, $2/$3 from 2026-03-01.
    early = pricer.price("scripted", "echo", usage, datetime(2025, 12, 31, 23, 59, tzinfo=UTC))
    january = pricer.price("scripted", "echo", usage, datetime(2026, 1, 1, tzinfo=UTC))
    last_moment = pricer.price("scripted", "echo", usage, datetime(2026, 2, 28, 23, 59, 59, tzinfo=UTC))
    march = pricer.price("scripted", "echo", usage, datetime(2026, 3, 1, tzinfo=UTC))
    assert (early.status, early.cost_usd) == (CostStatus.UNPRICED, None)
    assert january.cost_usd == last_moment.cost_usd == Decimal("2.0000000000")
    assert march.cost_usd == Decimal("5.0000000000")
    assert march.detail == "[[price]] #4 echo"


def test_exact_model_beats_glob_and_anthropic_1h_defaults_to_twice_input(tmp_path: Path) -> None:
    price_file = write_price_file(
        tmp_path,
        """
        [[price]]
        model = "claude-*"
        input_mtok = 100
        output_mtok = 100

        [[price]]
        provider = "anthropic"
        model = "claude-opus-4-1"
        input_mtok = "15"
        output_mtok = "75"
        cache_write_5m_mtok = "18.75"
        """,
    )
    pricer = Pricer(price_file)
    usage = TokenUsage(cache_write_5m_tokens=1_000_000, cache_write_1h_tokens=1_000_000)
    # No 1h price in the file for an Anthropic model: 2 x $15 input = $30 per million; 5m write $18.75.
    assert pricer.price("anthropic", "claude-opus-4-1", usage, AT).cost_usd == Decimal("48.7500000000")


def test_price_file_tiny_costs_are_quantized_to_1e10(tmp_path: Path) -> None:
    pricer = Pricer(write_price_file(tmp_path, '[[price]]\nmodel = "m"\ninput_mtok = "0.000123"\noutput_mtok = 0\n'))
    # 1 token at $0.000123 per million = $1.23e-10, kept to 1e-10: 1E-10.
    assert pricer.price("x", "m", TokenUsage(input_tokens=1), AT).cost_usd == Decimal("1E-10")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[price]\n", "prices.toml: invalid TOML: "),
        ("[prices]\n", "prices.toml: prices: unknown key"),
        ("price = 3\n", "prices.toml: price: expected an array, got an integer"),
        ("[[price]]\ninput_mtok = 1\noutput_mtok = 1\n", "prices.toml: price[0].model: required key missing"),
        (
            '[[price]]\nmodel = "a"\ninput_mtok = 1\noutput_mtok = 1\n[[price]]\nmodel = "b"\noutput_mtok = 1\n',
            "prices.toml: price[1].input_mtok: required key missing",
        ),
        (
            '[[price]]\nmodel = "a"\ninput_mtok = "three"\noutput_mtok = 1\n',
            "prices.toml: price[0].input_mtok: invalid decimal string",
        ),
        (
            '[[price]]\nmodel = "a"\ninput_mtok = -1\noutput_mtok = 1\n',
            "prices.toml: price[0].input_mtok: must be a finite non-negative number, got -1",
        ),
        (
            '[[price]]\nmodel = "a"\ninput_mtok = 1\noutput_mtok = 1\ninput_mtoks = 2\n',
            "prices.toml: price[0].input_mtoks: unknown key",
        ),
        (
            '[[price]]\nmodel = "a"\ninput_mtok = 1\noutput_mtok = 1\neffective_from = "next week"\n',
            "prices.toml: price[0].effective_from: not an ISO date or date-time: 'next week'",
        ),
        (
            '[[price]]\nmodel = "a"\ninput_mtok = 1\noutput_mtok = 1\n'
            '[[price]]\nmodel = "A"\ninput_mtok = 2\noutput_mtok = 2\n',
            "prices.toml: price[1]: same provider, model and effective_from as price[0]",
        ),
    ],
)
def test_bad_price_file(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "prices.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(PriceFileError) as caught:
        load_price_file(path)
    assert str(caught.value).startswith(f"{tmp_path}/{message}")
    assert "\n" not in str(caught.value)


def test_missing_price_file(tmp_path: Path) -> None:
    with pytest.raises(PriceFileError, match=r"missing\.toml: cannot read price file"):
        load_price_file(tmp_path / "missing.toml")
