"""The one-file HTML page: renders what ``analysis`` returned and embeds ``figures``' PNGs.

No network: styles are inlined, every image is a base64 data URI (the PNGs are also written
beside the page). Tables are rendered from DataFrames with escaping; lists become bullet lists.
"""

from __future__ import annotations

import base64
import html
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd

_PCT_COLS = {"share", "share_of_step", "busy_share", "overhead", "unattributed_share"}


def data_uri(png: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(Path(png).read_bytes()).decode("ascii")


def fmt(v: Any, col: str = "") -> str:
    """A cell as escaped HTML."""
    if isinstance(v, list | tuple):
        if not v:
            return ""
        if len(v) == 1:
            return html.escape(str(v[0]))
        return "<ul>" + "".join(f"<li>{html.escape(str(x))}</li>" for x in v) + "</ul>"
    if v is None or (not isinstance(v, str | dict) and pd.isna(v)):
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        base = col.rsplit(".", 1)[-1]
        if base in _PCT_COLS:
            return f"{v * 100:+.1f}%" if base == "overhead" else f"{v * 100:.1f}%"
        if base == "test_accuracy":
            return f"{v * 100:.2f}%"
        if v == 0:
            return "0"
        if abs(v) >= 1e6 or abs(v) < 1e-3:
            return f"{v:.3e}"
        return f"{v:.4g}" if abs(v) < 1000 else f"{v:,.0f}"
    return html.escape(str(v))


def _empty(v: Any) -> bool:
    if isinstance(v, list | tuple):
        return not v
    return v is None or (not isinstance(v, str | dict) and pd.isna(v)) or v == ""


def table(df: pd.DataFrame, columns: dict[str, str] | None = None, cell_class: dict[str, str] | None = None,
          raw: set[str] | None = None, compact: bool = False) -> str:
    """DataFrame -> <table>. ``columns`` maps column -> header (and picks/orders them); ``raw``
    columns hold HTML already escaped by the caller. ``compact`` (wide tables): columns empty in
    every row are left out, and list cells show a few cut names (``abbr_list``, full names in titles)."""
    if df is None or df.empty:
        return ""
    columns = columns or {c: c for c in df.columns}
    if compact:
        columns = {c: h for c, h in columns.items() if c in df.columns and not df[c].map(_empty).all()}
    raw = raw or set()
    head = "".join(f"<th>{html.escape(h)}</th>" for h in columns.values())
    body = []
    for _, row in df.iterrows():
        cells = []
        for c in columns:
            v = row.get(c)
            cls = (cell_class or {}).get(c) or ("num" if isinstance(v, int | float) and not isinstance(v, bool)
                                                 else "")
            text = v if c in raw else abbr_list(v, 30, keep=3) if compact and isinstance(v, list | tuple) else fmt(v, c)
            cells.append(f'<td class="{cls}">{text}</td>' if cls else f"<td>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def render(context: dict[str, Any]) -> str:
    pkg = resources.files("kernelmap.reports")
    env = jinja2.Environment(autoescape=jinja2.select_autoescape(["html", "j2"]), undefined=jinja2.StrictUndefined)
    template = env.from_string(pkg.joinpath("report.html.j2").read_text())
    ctx = dict(context)
    ctx["css"] = jinja2.utils.markupsafe.Markup(pkg.joinpath("report.css").read_text())
    for k, v in list(ctx.items()):
        if k.endswith("_html") and isinstance(v, str):
            ctx[k] = jinja2.utils.markupsafe.Markup(v)
    for key in ("op_tables", "figures", "answers"):
        for item in ctx.get(key, []):
            for k, v in list(item.items()):
                if k.endswith("html") and isinstance(v, str):
                    item[k] = jinja2.utils.markupsafe.Markup(v)
    if ctx.get("trend"):
        ctx["trend"]["table_html"] = jinja2.utils.markupsafe.Markup(ctx["trend"].get("table_html", ""))
    return template.render(**ctx)


def abbr(text: Any, limit: int = 36) -> str:
    """Escaped text cut to ``limit`` characters, the whole of it in a title attribute."""
    s = str(text)
    if len(s) <= limit:
        return html.escape(s)
    return f'<span class="abbr" title="{html.escape(s, quote=True)}">{html.escape(s[: limit - 1])}…</span>'


def abbr_list(values: Any, limit: int = 36, keep: int = 2) -> str:
    """A list cell for narrow tables: at most ``keep`` items, each cut by ``abbr``; the rest as
    "+N more" with their names in its title."""
    if not isinstance(values, list | tuple):
        return fmt(values)
    vals = [str(v) for v in values]
    if not vals:
        return ""
    shown = [abbr(v, limit) for v in vals[:keep]]
    rest = vals[keep:]
    if rest:
        shown.append(f'<span class="abbr" title="{html.escape(chr(10).join(rest), quote=True)}">'
                     f"+{len(rest)} more</span>")
    return "<br>".join(shown)
