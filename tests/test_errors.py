from kdist.errors import cause


def test_cause_drops_terminal_colour_codes():
    assert cause(ValueError("\x1b[1mbad\x1b[0m value\nsecond line")) == "ValueError: bad value\nsecond line"


def test_cause_keeps_the_first_non_blank_lines_up_to_a_limit():
    assert cause(ValueError("\n  first  \n\nsecond\nthird"), lines=2) == "ValueError: first second"
    assert cause(ValueError("\n  first  \n\nsecond\nthird"), lines=1, limit=3) == "ValueError: fir"
