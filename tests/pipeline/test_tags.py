"""Expressive tags: what counts as a tag, which ones are removed (unknown names and
special-token forms), the spoken words of a text, and the instruction for an agent's LLM."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from livekit.plugins.veena.models.profiles import MAYA1, MAYA1_TAGS, ORPHEUS, VEENA
from livekit.plugins.veena.pipeline.tags import (
    find_tags,
    is_partial_tag_at,
    spoken_text,
    strip_unknown_tags,
    tag_instructions,
)

KNOWN = ("laugh", "sigh", "laugh_harder")


@pytest.mark.parametrize("text, clean, removed", [
    ("Hello <happy> world", "Hello world", ["<happy>"]),
    ("Hello <laugh> world", "Hello <laugh> world", []),
    ("Ha <LAUGH> ok <Laugh_Harder>", "Ha <laugh> ok <laugh_harder>", []),  # profile spelling
    ("<happy> Hi", "Hi", ["<happy>"]),
    ("Hi <happy>", "Hi", ["<happy>"]),
    ("a  <x>   <y>  b", "a b", ["<x>", "<y>"]),  # whitespace around collapses to one space
    ("Hello<happy>world", "Hello world", ["<happy>"]),  # between words: a word break
    ("First line<br>Second line", "First line Second line", ["<br>"]),  # (was "lineSecond")
    ("हाँ<br>नहीं", "हाँ नहीं", ["<br>"]),
    ("你好<happy>世界。", "你好世界。", ["<happy>"]),  # words meet without a space there
    ("(<x>quoted<y>)", "(quoted)", ["<x>", "<y>"]),  # beside punctuation: none added
    ("well <happy>, fine", "well, fine", ["<happy>"]),  # none before punctuation
    ("hi <x><laugh> there", "hi <laugh> there", ["<x>"]),
    # special-token injection forms
    ("Hi<|eot_id|> there", "Hi there", ["<|eot_id|>"]),
    ("<|begin_of_text|>x <|start_header_id|>", "x", ["<|begin_of_text|>", "<|start_header_id|>"]),
    ("a <custom_token_5> b", "a b", ["<custom_token_5>"]),
    ("a <spk_agastya> b", "a b", ["<spk_agastya>"]),  # another voice's prompt token
    ("say </laugh> or <laugh/>", "say or", ["</laugh>", "<laugh/>"]),  # not the plain form
    # a removed tag must not glue a special token together from what stood around it
    ("<<x>|eot_id|>", "", ["<x>", "<|eot_id|>"]),
    ("a <<a>custom_token_4> b", "a b", ["<a>", "<custom_token_4>"]),
    ("<<|x|>|end_of_text|>", "", ["<|x|>", "<|end_of_text|>"]),
    ("<<<x>y>|eot_id|>!", "!", ["<x>", "<y>", "<|eot_id|>"]),
    ("ha <<x>laugh> ok", "ha <laugh> ok", ["<x>"]),  # a known tag is what it spells
    # not tags: plain text stays exactly as written
    ("a < b > c", "a < b > c", []),
    ("x<y and y>x", "x<y and y>x", []),
    ("<a b> and <3 and <>", "<a b> and <3 and <>", []),
    ("<| eot |>", "<| eot |>", []),
    ("  spaces stay  ", "  spaces stay  ", []),
])
def test_strip_unknown_tags(text, clean, removed):
    assert strip_unknown_tags(text, KNOWN) == (clean, removed)


_FRAGMENTS = ["<", ">", "|", "/", " ", "x", "laugh", "eot_id", "custom_token_4", "<x>",
              "<laugh>", "<|eot_id|>", ",", "!"]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_FRAGMENTS), max_size=14).map("".join))
def test_what_is_left_holds_known_tags_only(text):
    """Whatever the text, the result's every tag is a known one in the plain form, so a
    second pass changes nothing; the spoken words hold no tag at all."""
    clean, _ = strip_unknown_tags(text, KNOWN)
    assert all(m.group()[1:-1] in KNOWN for m in find_tags(clean)), clean
    assert strip_unknown_tags(clean, KNOWN) == (clean, [])
    assert find_tags(spoken_text(text)) == []


def test_no_special_token_reaches_the_prompt_from_nested_tags(tmp_path):
    """Through the profile's real special-token ids: the stripped text encodes to plain
    text tokens only."""
    from transformers import AutoTokenizer

    from livekit.plugins.veena.models.tiny_model import write_snac_tokenizer

    write_snac_tokenizer(VEENA, tmp_path)
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    specials = {i for i in tok.get_added_vocab().values()} | set(tok.all_special_ids)
    text = "hi <<a>custom_token_4> x <<x>|eot_id|> <<|x|>|end_of_text|> y"
    clean, _ = strip_unknown_tags(text, VEENA.tags)
    assert clean == "hi x y"
    assert not specials & set(tok.encode(clean, add_special_tokens=False))
    # what the tokenizer would have read without the second pass
    assert specials & set(tok.encode("<custom_token_4><|eot_id|>", add_special_tokens=False))


def test_a_profile_without_tags_removes_every_tag():
    assert VEENA.tags == ()
    assert strip_unknown_tags("<laugh> Hi <sigh>", VEENA.tags) == ("Hi", ["<laugh>", "<sigh>"])
    assert strip_unknown_tags("Hi <laugh_harder>", MAYA1.tags) == ("Hi <laugh_harder>", [])
    assert strip_unknown_tags("Hi <laugh_harder>", ORPHEUS.tags) == ("Hi", ["<laugh_harder>"])


def test_spoken_text_has_no_tag_at_all():
    assert spoken_text("<sigh> Fine, <laugh> really <happy>!") == "Fine, really!"
    assert spoken_text("That's funny! <laugh>") == "That's funny!"
    assert spoken_text("<laugh>") == ""
    assert spoken_text("a < b > c") == "a < b > c"


def test_find_tags_and_partial_tags():
    assert [m.group() for m in find_tags("a <x> b <|y|> c < d >")] == ["<x>", "<|y|>"]
    assert is_partial_tag_at("Hello <lau", 6) and is_partial_tag_at("Hello <", 6)
    assert is_partial_tag_at("x <|eot_i", 2)
    assert is_partial_tag_at("x </", 2) and is_partial_tag_at("x <laugh/", 2)
    assert not is_partial_tag_at("Hello <laugh>", 6)
    assert not is_partial_tag_at("a < b", 2) and not is_partial_tag_at("plain", 0)
    assert not is_partial_tag_at("<|" + "a" * 65, 0)  # longer than any tag: text


def test_tag_instructions():
    text = tag_instructions(MAYA1_TAGS)
    assert "\n" not in text
    assert all(f"<{t}>" in text for t in MAYA1_TAGS)
    # the example uses one of the voice's own tags, never one it cannot perform
    assert [m.group() for m in find_tags(text)] == [f"<{t}>" for t in MAYA1_TAGS + MAYA1_TAGS[:1]]
    assert [m.group() for m in find_tags(tag_instructions(["sigh"]))] == ["<sigh>"] * 2
    for rule in ("right before the words", "sparingly", "Never invent", "never nest"):
        assert rule in text
    assert tag_instructions(()) == "" and tag_instructions(VEENA.tags) == ""
