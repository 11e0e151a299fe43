"""Model profiles: prompt layouts from the model cards, overrides, clear errors."""

import pytest

from livekit.plugins.veena.profiles import ORPHEUS, VEENA, VEENA3, get_profile, with_overrides


class _Tok:
    def encode(self, text, add_special_tokens=False):
        self.seen = (text, add_special_tokens)
        return [1, 2, 3]


def test_veena_prompt_layout():
    tok = _Tok()
    assert VEENA.build_prompt(tok, "Namaste", "kavya") == [128259, 1, 2, 3, 128260, 128261, 128257]
    assert tok.seen == ("<spk_kavya> Namaste", False)


def test_orpheus_prompt_layout():
    tok = _Tok()
    assert ORPHEUS.build_prompt(tok, "Hi", "tara") == [128259, 1, 2, 3, 128009, 128260, 128261, 128257]
    assert tok.seen == ("tara: Hi", True)


def test_overrides_and_lookup():
    custom = with_overrides(VEENA, voices=("asha",), default_voice="asha")
    assert custom.check_voice("asha") == "asha" and VEENA.voices != custom.voices
    assert get_profile("veena3") is VEENA3 and len(VEENA3.voices) == 12
    with pytest.raises(ValueError, match="known profiles: veena, orpheus, veena3"):
        get_profile("nope")
