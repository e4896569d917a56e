from kdist.errors import cause


def test_cause_drops_terminal_colour_codes():
    assert cause(ValueError("\x1b[1mbad\x1b[0m value\nsecond line")) == "ValueError: bad value\nsecond line"


def test_cause_keeps_the_first_non_blank_lines_up_to_a_limit():
    assert cause(ValueError("\n  first  \n\nsecond\nthird"), lines=2) == "ValueError: first second"
    assert cause(ValueError("\n  first  \n\nsecond\nthird"), lines=1, limit=3) == "ValueError: fir"


def test_cause_names_the_error_keras_failed_to_re_raise():
    """Keras 3.15's traceback filter can fail while re-raising (AttributeError: ... '_error_repr'): the cause is the
    error it was re-raising, not that one."""
    try:
        try:
            raise ValueError("the real fault")
        except ValueError:
            raise AttributeError("'str' object has no attribute '_error_repr'") from None
    except AttributeError as e:
        error = e
    assert error.__context__ is not None and cause(error) == "ValueError: the real fault"
