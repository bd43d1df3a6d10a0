"""The shared look of the figures (specalign.figstyle): colours and sizes."""

import matplotlib
import pytest
from matplotlib.colors import to_hex

from specalign import figstyle


@pytest.mark.parametrize("n", [1, 2, 5, 8, 9, 20, 28])
def test_qualitative_colours_are_distinct_and_start_colour_blind_safe(n):
    colours = [to_hex(c) for c in figstyle.qualitative(n)]
    assert len(colours) == n and len(set(colours)) == n
    assert colours[: min(n, 8)] == [c.lower() for c in figstyle.OKABE_ITO[: min(n, 8)]]


@pytest.mark.parametrize(
    ("kind", "n"), [("sequential", 1), ("sequential", 7), ("cyclic", 1), ("cyclic", 12)]
)
def test_ordered_and_cyclic_colours_are_distinct(kind, n):
    colours = [to_hex(c) for c in getattr(figstyle, kind)(n)]
    assert len(colours) == n and len(set(colours)) == n


def test_the_context_scales_every_size_and_an_unknown_one_is_refused():
    with matplotlib.rc_context():
        sizes = {}
        for context, scale in figstyle.CONTEXT_SCALE.items():
            figstyle.set_theme(context)
            sizes[context] = matplotlib.rcParams["axes.labelsize"] / scale
            assert matplotlib.rcParams["axes.grid"]
        base = sizes["notebook"]
        assert sizes == {c: pytest.approx(base) for c in sizes}  # one base size, scaled
        with pytest.raises(ValueError, match="plots.context: 'huge'"):
            figstyle.set_theme("huge")


def test_the_axes_style_holds_only_inside_its_block():
    with matplotlib.rc_context({"axes.grid": False}):
        with figstyle.axes_style():
            assert matplotlib.rcParams["axes.grid"]
        with figstyle.axes_style(grid=False):
            assert not matplotlib.rcParams["axes.grid"]
        assert not matplotlib.rcParams["axes.grid"]
