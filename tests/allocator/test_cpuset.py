import pytest
from hypothesis import given
from hypothesis import strategies as st

from allocator import CPUSet


@pytest.mark.parametrize(
    ("text", "ids", "canonical"),
    [
        ("", [], ""),
        ("0", [0], "0"),
        ("0-3,8", [0, 1, 2, 3, 8], "0-3,8"),
        ("8,0-3", [0, 1, 2, 3, 8], "0-3,8"),
        ("1,2", [1, 2], "1-2"),
        ("0-2,5\n", [0, 1, 2, 5], "0-2,5"),
        ("3-3", [3], "3"),
        ("0-1,1-2", [0, 1, 2], "0-2"),
        ("28-55,84-111", list(range(28, 56)) + list(range(84, 112)), "28-55,84-111"),
    ],
)
def test_parse_and_print(text, ids, canonical):
    s = CPUSet.parse(text)
    assert list(s) == ids
    assert str(s) == canonical
    assert len(s) == len(ids)


@pytest.mark.parametrize("text", ["3-1", "a", "1,,2", "-1", "1-", ",1", "1-a", "0x1", "1 2", "１"])
def test_parse_rejects_bad_text_quoting_it(text):
    with pytest.raises(ValueError) as e:
        CPUSet.parse(text)
    assert repr(text) in str(e.value)


def test_algebra():
    a, b = CPUSet.parse("0-5"), CPUSet.parse("4-9")
    assert str(a | b) == "0-9"
    assert str(a & b) == "4-5"
    assert str(a - b) == "0-3"
    assert str(a ^ b) == "0-3,6-9"
    assert CPUSet.parse("1-2") <= a and not a <= CPUSet.parse("1-2")
    assert a.isdisjoint(CPUSet.parse("6-7"))
    assert 3 in a and 7 not in a and -1 not in a
    assert a.min() == 0 and a.max() == 5
    assert hash(CPUSet([1, 2])) == hash(CPUSet.parse("1-2"))
    assert CPUSet.range(2, 4) == CPUSet([2, 3, 4])


def test_immutable_and_typed():
    s = CPUSet([1])
    with pytest.raises(AttributeError):
        s._mask = 3  # type: ignore[misc]
    with pytest.raises(ValueError):
        CPUSet([-1])
    with pytest.raises(TypeError):
        CPUSet(["1"])  # type: ignore[list-item]
    with pytest.raises(ValueError):
        CPUSet().min()


@given(st.sets(st.integers(min_value=0, max_value=600)))
def test_round_trip(ids):
    s = CPUSet(ids)
    assert CPUSet.parse(str(s)) == s
    assert set(s) == ids
    assert len(s) == len(ids)


@given(st.sets(st.integers(0, 200)), st.sets(st.integers(0, 200)))
def test_algebra_matches_python_sets(a, b):
    x, y = CPUSet(a), CPUSet(b)
    assert set(x | y) == a | b
    assert set(x & y) == a & b
    assert set(x - y) == a - b
    assert (x <= y) == (a <= b)
