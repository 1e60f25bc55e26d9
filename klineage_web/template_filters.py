"""Formatting for measurements and fingerprints on both apps' pages, and their filter controls (the `klineage`
tag library, registered in settings.TEMPLATES)."""

from __future__ import annotations

import json
import math
import re
from typing import Any

from django import template

from klineage.skills.standing import ratio_text
from klineage_web.short_ids import SHORT

register = template.Library()


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


@register.filter
def short(fingerprint: Any, length: int = SHORT) -> str:
    """The first characters of a fingerprint or key."""
    return str(fingerprint or "")[: int(length)]


@register.filter
def duration_us(value: Any) -> str:
    number = _number(value)
    if number is None:
        return "–"
    if number >= 1e6:
        return f"{number / 1e6:.2f} s"
    if number >= 1e3:
        return f"{number / 1e3:.2f} ms"
    return f"{number:.1f} µs"


@register.filter
def seconds(value: Any) -> str:
    number = _number(value)
    if number is None:
        return "–"
    return f"{number * 1e3:.1f} ms" if number < 1 else f"{number:.2f} s"


@register.filter
def sci(value: Any) -> str:
    """An error magnitude: 2.98e-07, or 0."""
    number = _number(value)
    if number is None:
        return "–"
    return "0" if number == 0 else f"{number:.2e}"


@register.filter
def percent(value: Any) -> str:
    number = _number(value)
    return "–" if number is None else f"{100 * number:.0f}%"


@register.filter
def ratio(value: Any) -> str:
    number = _number(value)
    return "–" if number is None else f"{number:.2f}×"


@register.filter
def times(value: Any) -> str:
    """A ratio with three decimals and its unit, 0.9949 as 0.995x (`ratio` rounds to two)."""
    number = _number(value)
    return "–" if number is None else ratio_text(number)


@register.filter
def si(value: Any, unit: str = "") -> str:
    """1.34e9 -> '1.34 G' + unit; for flops and bytes."""
    number = _number(value)
    if number is None:
        return "–"
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(number) >= factor:
            return f"{number / factor:.2f} {prefix}{unit}"
    return f"{number:g} {unit}".strip()


@register.filter
def count(value: Any) -> str:
    number = _number(value)
    return "–" if number is None else f"{int(number):,}".replace(",", "\u202f")


@register.filter
def get(mapping: Any, key: Any) -> Any:
    return mapping.get(key) if isinstance(mapping, dict) else None


@register.filter
def as_json(value: Any) -> str:
    """A JSON value as readable text (lists and tables indented)."""
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=1, sort_keys=True, ensure_ascii=False)


@register.filter
def dims(value: Any) -> str:
    """A grid or block triple as 'x × y × z', dropping trailing 1s."""
    if not isinstance(value, (list, tuple)):
        return str(value)
    items = list(value)
    while len(items) > 1 and items[-1] in (1, "1"):
        items.pop()
    return " × ".join(str(v) for v in items)


@register.filter
def plan_arg(arg: Any) -> str:
    """A launch argument as the plan's table of launches shows it: a buffer by name, a scalar with its
    type, a TMA tensor map with its dtype, dims, byte strides, box, swizzle and L2 promotion."""
    if isinstance(arg, dict) and "buffer" in arg:
        return str(arg["buffer"])
    if isinstance(arg, dict) and "scalar" in arg:
        return f"{arg['scalar']} : {arg.get('type', 'i32')}"
    if isinstance(arg, dict) and "tensor_map" in arg:
        return _tensor_map_arg(arg)
    return str(arg)


def _tensor_map_arg(arg: dict[str, Any]) -> str:
    """tensor_map(x: bf16, dims [K, M], strides [K * 2], box [BLOCK_K, BLOCK_M], swizzle 128B, L2 promotion 256B)"""

    def listed(values: Any) -> str:
        return "[" + ", ".join(str(v) for v in values) + "]" if isinstance(values, (list, tuple)) else str(values)

    head = str(arg["tensor_map"]) + (f": {arg['dtype']}" if arg.get("dtype") else "")
    parts = [head, f"dims {listed(arg.get('dims', []))}"]
    if arg.get("strides"):  # rank 1 has none: dimension 0's stride is the element size
        parts.append(f"strides {listed(arg['strides'])}")
    parts.append(f"box {listed(arg.get('box', []))}")
    parts += [f"{label} {arg[key]}" for key, label in (("swizzle", "swizzle"), ("l2_promotion", "L2 promotion"))
              if arg.get(key)]
    return f"tensor_map({', '.join(parts)})"


@register.filter
def breakable(name: Any) -> str:
    """A path-like name that may wrap after each '/' (row_softmax/<wbr>warp_vec4), escaped."""
    from django.utils.html import escape
    from django.utils.safestring import mark_safe

    return mark_safe("/<wbr>".join(escape(part) for part in str(name).split("/")))


@register.filter
def docstring(text: Any) -> str:
    """A problem's docstring as HTML: blank lines part paragraphs, wrapped lines join up again,
    and lines starting with '- ' become list items (a following indented or plain line continues one)."""
    from django.utils.html import escape
    from django.utils.safestring import mark_safe

    html = []
    for block in re.split(r"\n\s*\n", str(text or "").strip()):
        lead: list[str] = []
        items: list[list[str]] = []
        for line in (raw.strip() for raw in block.splitlines()):
            if line.startswith(("- ", "* ")):
                items.append([line[2:]])
            elif items:
                items[-1].append(line)
            else:
                lead.append(line)
        if lead:
            html.append(f"<p>{escape(' '.join(lead))}</p>")
        if items:
            html.append("<ul>" + "".join(f"<li>{escape(' '.join(item))}</li>" for item in items) + "</ul>")
    return mark_safe("".join(html))


@register.inclusion_tag("skills/_select_filter.html")
def select_filter(name: str, label: str, choices: Any, selected: Any, blank: str = "any") -> dict[str, Any]:
    """A list page's filter <select>: a blank option, then `choices` (values, or (value, label) pairs),
    the `selected` value marked."""
    options = [choice if isinstance(choice, (list, tuple)) else (choice, choice) for choice in choices]
    return {"name": name, "label": label, "options": options, "selected": selected, "blank": blank}
