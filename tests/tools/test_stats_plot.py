"""`rmqstore stats --plot`: the time axis spans the data (not years for data under a minute) and topic names
in CJK are drawn with a font that has their glyphs, or one warning names them and the package to install."""
from __future__ import annotations

import warnings

import pytest

from conftest import golden_store

pytest.importorskip("matplotlib")


def _glyph_warnings(caplog, caught) -> list[str]:
    """The missing-glyph warnings: ours (logged) and matplotlib's (warnings.warn), which must not leak."""
    return [r.getMessage() for r in caplog.records if "glyph" in r.getMessage().lower()] + \
        [str(w.message) for w in caught if "glyph" in str(w.message).lower()]


def test_plot_of_golden_store_fits_its_span_and_names_cjk_glyphs(golden, tmp_path, caplog):
    import matplotlib.pyplot as plt

    import importlib
    S = importlib.import_module("rmqstore.spark.stats")   # rmqstore.spark.stats is also the function
    store = golden_store(golden, "rmq440-clean")
    out = tmp_path / "rates.png"
    rows = S.stats(store, plot=str(out), config=str(golden / "rmq440-clean" / "store.conf"))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    span_ms = max(r["lastStoreTime"] for r in rows) - min(r["firstStoreTime"] for r in rows)
    assert span_ms < 60_000 and "订单Topic" in {r["topic"] for r in rows}

    assert len(_glyph_warnings(caplog, [])) <= 1       # stats' own plot: one warning at most (no CJK font)

    _, per_second = S.local_scan(store, S.StoreConfig.load(golden / "rmq440-clean" / "store.conf"))
    S._warned_glyphs.clear()
    caplog.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig = S.draw_rates(per_second, name="store", where="rates.png")
    ax = fig.axes[0]
    lo, hi = ax.get_xlim()
    assert (hi - lo) * 86400 < 10 * 60, "the axis spans the data's seconds, not years"
    labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert len(set(labels)) >= 3 and all(lab.count(":") == 2 for lab in labels), labels   # HH:MM:SS
    assert "per second" in ax.get_ylabel()
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(t.startswith("订单Topic") for t in legend), legend
    families, missing = S._font_for(["订单Topic"])
    glyph_warnings = _glyph_warnings(caplog, caught)
    if missing:      # no CJK font installed: exactly one warning naming the characters and a package
        assert len(glyph_warnings) == 1 and "订" in glyph_warnings[0] and "fonts-noto-cjk" in glyph_warnings[0]
    else:            # a CJK font is installed: it is in the legend's font list, no warning
        assert len(families) >= 2 and not glyph_warnings, (families, glyph_warnings)
        used = ax.get_legend().get_texts()[0].get_fontproperties().get_family()
        assert any(f in used for f in families[1:]), used
    plt.close(fig)


def test_plot_warns_once_naming_glyphs_no_font_has(tmp_path, caplog):
    """A topic in a script no installed font covers (Egyptian hieroglyphs here, CJK on a machine without a
    CJK font): the plot is still written, and one warning names the characters and a font package."""
    import importlib
    S = importlib.import_module("rmqstore.spark.stats")
    S._warned_glyphs.clear()
    topic = "\U00013000Topic"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(2):      # twice: still one warning
            S.plot_rates({topic: {1_795_328_096: 3, 1_795_328_097: 5}}, str(tmp_path / f"p{i}.png"))
    msgs = _glyph_warnings(caplog, caught)
    assert len(msgs) == 1 and "\U00013000" in msgs[0] and "fonts-noto-cjk" in msgs[0], msgs
    assert "p0.png" in msgs[0]
    assert (tmp_path / "p1.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
