"""``rksc_sgl.protocol``: what every option parser does with a ``custom_params`` that is not an
object (SGLang declares it an object but passes anything through to the tokenizer's checks)."""

from __future__ import annotations

import pytest

from rksc_sgl.protocol import AsksOptions, BranchTag, EarlyExitParams


@pytest.mark.parametrize("parser", [BranchTag, EarlyExitParams, AsksOptions])
@pytest.mark.parametrize("bad", ["x", 3, ["rksc"]])
def test_custom_params_that_is_not_an_object_is_refused(parser, bad):
    with pytest.raises(ValueError, match="custom_params must be an object"):
        parser.from_custom_params(bad)


@pytest.mark.parametrize("parser", [BranchTag, EarlyExitParams])
def test_absent_options_are_none(parser):
    assert parser.from_custom_params(None) is None
    assert parser.from_custom_params({"someone_else": 1}) is None
