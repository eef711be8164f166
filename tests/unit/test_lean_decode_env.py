import pytest

from radix_ext.cpu import decode


@pytest.mark.parametrize("value, on", [("1", True), ("0", False), ("", True), (" 0 ", False)])
def test_switch(monkeypatch, value, on):
    monkeypatch.setenv(decode.LEAN_ENV, value)
    assert decode.enabled() is on


def test_bad_value_names_the_variable(monkeypatch):
    monkeypatch.setenv(decode.LEAN_ENV, "yes")
    with pytest.raises(ValueError, match="RKSC_CPU_LEAN_DECODE must be 0 or 1, got 'yes'"):
        decode.enabled()
