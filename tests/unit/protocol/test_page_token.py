"""A page token is a plan number an agent's SQL store can hold: one past 2^63 - 1 is refused on
the wire, naming the field (before: it passed, and every agent answered INTERNAL)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from stratagem.protocol import PlansPage, PlansQuery


def test_a_page_token_up_to_two_to_the_63_minus_one_is_taken() -> None:
    assert PlansQuery(page_token=str(2**63 - 1)).page_token == "9223372036854775807"
    assert PlansQuery(page_token="").page_token == ""


@pytest.mark.parametrize("token", [str(2**63), "9" * 20])
def test_a_page_token_past_two_to_the_63_is_refused_naming_the_field(token: str) -> None:
    with pytest.raises(ValidationError) as refused:
        PlansQuery(page_token=token)
    (error,) = refused.value.errors()
    assert error["loc"] == ("page_token",)
    assert "a page token is a plan number up to 9223372036854775807" in error["msg"]
    with pytest.raises(ValidationError, match="next_page_token"):
        PlansPage(next_page_token=token)
