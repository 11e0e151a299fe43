"""Type-and-range checks at every edge: a bool is not an int, a float is not an int, NaN is
not a number. These are the values that, unchecked, reach vLLM and kill its engine core."""

import math

import numpy as np
import pytest
from livekit.plugins import veena

from livekit.plugins.veena.models.profiles import VEENA3
from livekit.plugins.veena.pipeline.engine_options import SamplingOptions
from livekit.plugins.veena.validation import (
    check_float,
    check_int,
    check_int_list,
    is_int,
    is_number,
)

POISON = [1.5, True, False, "7", None, [], {}, math.nan, math.inf]


@pytest.mark.parametrize("value", [True, False, 1.0, 1.5, "1", None, math.nan])
def test_check_int_refuses_what_is_not_an_int(value):
    with pytest.raises(ValueError, match="must be an integer"):
        check_int("max_tokens", value, 1)


def test_check_int_takes_python_and_numpy_ints_in_range():
    assert check_int("n", 3, 1, 5) == 3 and check_int("n", np.int64(4), 1, 5) == 4
    assert type(check_int("n", np.int64(4), 1, 5)) is int
    with pytest.raises(ValueError, match=r"in \[1, 5\]"):
        check_int("n", 6, 1, 5)
    assert is_int(7) and not is_int(True) and not is_int(7.0)


@pytest.mark.parametrize("value", [True, math.nan, math.inf, -math.inf, "0.5", None, [0.5]])
def test_check_float_refuses_bools_and_non_finite(value):
    with pytest.raises(ValueError, match="finite number"):
        check_float("temperature", value, 0.0, 2.0)


def test_check_float_ranges_and_open_bounds():
    assert check_float("t", 1, 0.0, 2.0) == 1.0
    with pytest.raises(ValueError):
        check_float("top_p", 0.0, 0.0, 1.0, lo_open=True)
    with pytest.raises(ValueError):
        check_float("t", 2.5, 0.0, 2.0)


def test_check_int_list():
    assert check_int_list("g", [1, 2], 0, 9, length=2) == (1, 2)
    for bad in ([1.0, 2], [True, 2], [1], "12", [1, 10]):
        with pytest.raises(ValueError):
            check_int_list("g", bad, 0, 9, length=2)


@pytest.mark.parametrize("field", ["max_tokens", "min_tokens", "top_k", "seed",
                                   "stream_interval"])
@pytest.mark.parametrize("value", [1.5, True, 2.0, "3", math.nan])
def test_sampling_int_fields_refuse_non_ints(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingOptions(**{field: value}).validate()


@pytest.mark.parametrize("field", ["temperature", "top_p", "repetition_penalty"])
@pytest.mark.parametrize("value", [True, math.nan, math.inf, "0.5", None])
def test_sampling_float_fields_refuse_non_numbers(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingOptions(**{field: value}).validate()


def test_sampling_valid_values_pass_and_ints_count_as_floats():
    s = SamplingOptions(temperature=1, top_p=1, top_k=40, max_tokens=70, min_tokens=7, seed=3)
    assert s.validate() is s
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingOptions(max_tokens=5, min_tokens=6).validate()
    with pytest.raises(ValueError, match="top_k"):
        SamplingOptions(top_k=0).validate()
    for interval in (0, -7, 4097):
        with pytest.raises(ValueError, match="stream_interval"):
            SamplingOptions(stream_interval=interval).validate()


def test_globals_refuse_floats_and_bools():
    with pytest.raises(ValueError, match="speaker_globals"):
        VEENA3.check_globals([1.0] * 32)
    with pytest.raises(ValueError, match="speaker_globals"):
        VEENA3.check_globals([True] * 32)
    assert VEENA3.check_globals(list(np.arange(32))) == tuple(range(32))


@pytest.mark.parametrize("kwargs", [
    {"temperature": True}, {"temperature": math.nan}, {"top_p": math.inf}, {"top_k": 2.0},
    {"max_tokens_per_chunk": 1.5}, {"max_tokens_per_chunk": True}, {"seed": 1.0},
    {"seed": -1}, {"max_chunks_in_flight": True}, {"max_chunks_in_flight": 0},
    {"chunk_crossfade_ms": math.nan}, {"startup_timeout": 0}, {"voice": 3},
    {"temperature": 10**400}, {"startup_timeout": 10**400}, {"top_k": 10**400},
    {"chunker": veena.ChunkerOptions(first_max_chars=20.5)},
    {"chunker": veena.ChunkerOptions(max_chars=math.inf)},
    {"chunker": veena.ChunkerOptions(first_min_chars=True)},
    {"chunker": {"max_chars": 100}}, {"profile": 123}, {"profile": object()},
    {"base_url": 123}, {"base_url": "ftp://127.0.0.1:9"}, {"api_key": 5},
])
def test_plugin_options_checked_at_construction(kwargs):
    with pytest.raises(ValueError):
        veena.TTS(**{"base_url": "ws://127.0.0.1:9", **kwargs})


def test_numbers_past_a_float_are_not_numbers():
    assert not is_number(10**400) and not is_number(-(10**400)) and is_number(10**300)
    assert is_number(np.float32(0.5)) and not is_number(np.float32("nan"))
    assert not is_number(np.True_)
    with pytest.raises(ValueError, match="finite number"):
        check_float("temperature", 10**400, 0.0, 2.0)


def test_plugin_update_options_checked():
    t = veena.TTS(base_url="ws://127.0.0.1:9")
    with pytest.raises(ValueError, match="max_tokens"):
        t.update_options(max_tokens_per_chunk=2.5)
    with pytest.raises(ValueError, match="temperature"):
        t.update_options(temperature=False)
    t.update_options(temperature=0.5, max_tokens_per_chunk=70)


@pytest.mark.parametrize("field, value", [
    ("socket_send_buffer_bytes", 2**31),  # setsockopt took it: every WebSocket upgrade a 500
    ("max_connection_buffer_bytes", 2**40),
    ("turn_timeout_s", 1e9),
    ("drain_s", 1e7),
])
def test_server_settings_past_what_the_os_takes_fail_at_start(field, value):
    from livekit.plugins.veena.server.options import ServerOptions

    with pytest.raises(ValueError, match=field):
        ServerOptions(**{field: value}).validate()
    ServerOptions(**{field: value // 2**20 if isinstance(value, int) else 3600.0}).validate()
