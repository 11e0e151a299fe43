"""The one protocol module both sides use: builders and parsers round-trip, and the client
maps every error code through the same table the server answers with."""

import json

import pytest
from livekit.agents import APIConnectionError, APIStatusError, APITimeoutError

from livekit.plugins.veena.pipeline.engine import (
    EngineDeadError,
    EngineError,
    EngineStartingError,
)
from livekit.plugins.veena.plugin.remote import server_error
from livekit.plugins.veena.plugin.speakers import _map_error
from livekit.plugins.veena.protocol import (
    ERROR_CODES,
    ProtocolError,
    cancel_message,
    decode_audio,
    done_event,
    encode_audio,
    error_event,
    flush_message,
    parse_client_message,
    parse_server_event,
    speak_message,
    waiting_event,
)


def test_client_messages_round_trip_through_the_server_parser():
    first = speak_message("c1", "Hello ", True, {"voice": "kavya", "seed": 7,
                                                 "sampling": {"max_tokens": 70}})
    msg = parse_client_message(json.dumps(first))
    assert (msg.type, msg.context_id, msg.text, msg.more, msg.voice, msg.seed) == \
        ("speak", "c1", "Hello ", True, "kavya", 7)
    assert msg.sampling == {"max_tokens": 70}
    end = parse_client_message(json.dumps(speak_message("c1", "", False)))
    assert end.more is False and end.voice is None
    assert parse_client_message(json.dumps(flush_message("c1"))).type == "flush"
    assert parse_client_message(json.dumps(cancel_message("c1"))).type == "cancel"


def test_server_events_round_trip_through_the_client_parser():
    done = parse_server_event(json.dumps(done_event("c1", 1.23456)))
    assert done.type == "done" and done.terminal and done.audio_seconds == pytest.approx(1.2346)
    err = parse_server_event(json.dumps(error_event("c1", "overloaded", "full")))
    assert (err.code, err.message, err.raw["retryable"]) == ("overloaded", "full", True)
    assert not parse_server_event(json.dumps(waiting_event("c1"))).terminal
    with pytest.raises(ProtocolError):
        parse_server_event("[1, 2]")
    assert decode_audio(encode_audio("ctx", b"\x01\x02")) == ("ctx", b"\x01\x02")


@pytest.mark.parametrize("bad", ['{"type": "speak", "context_id": "\\ud800"}',
                                 '{"type": "speak", "context_id": "c", "text": "\\udfff"}',
                                 '{"type": "speak", "context_id": "c", "seed": true}'])
def test_unencodable_or_mistyped_values_are_refused(bad):
    with pytest.raises(ProtocolError):
        parse_client_message(bad)


@pytest.mark.parametrize("code", sorted(ERROR_CODES))
def test_every_code_maps_by_the_table(code):
    spec = ERROR_CODES[code]
    err = server_error(code, "why", {}, audio_pushed=False)
    assert err.retryable == spec.retryable
    if code == "timeout":
        assert isinstance(err, APITimeoutError)
    else:
        assert isinstance(err, APIStatusError) and err.status_code == spec.status
    assert not server_error(code, "why", {}, audio_pushed=True).retryable


def test_unknown_code_is_a_transient_server_fault():
    err = server_error("brand_new", "?", {}, audio_pushed=False)
    assert isinstance(err, APIConnectionError) and err.retryable


def test_engine_errors_at_the_plugin_edge():
    dead = _map_error(EngineDeadError("gone"), audio_pushed=False)
    assert isinstance(dead, APIConnectionError) and not dead.retryable
    assert _map_error(EngineError("blip"), audio_pushed=False).retryable
    assert isinstance(_map_error(EngineStartingError("slow"), False), APITimeoutError)
