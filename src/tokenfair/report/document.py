"""A tiny document model rendered twice: Markdown and a self-contained HTML page.

The report is built once as a list of blocks, so report.md and report.html always say
the same thing. Inline `code` in text becomes <code> in HTML; nothing else is parsed.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Heading:
    text: str
    level: int = 2


@dataclass(frozen=True, slots=True)
class Paragraph:
    text: str


@dataclass(frozen=True, slots=True)
class Bullets:
    items: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Table:
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    caption: str = ""


@dataclass(frozen=True, slots=True)
class Image:
    path: str  # relative to the report
    alt: str
    caption: str = ""


Block = Heading | Paragraph | Bullets | Table | Image

_CODE = re.compile(r"`([^`]+)`")
_STYLE = """
body { font-family: system-ui, sans-serif; max-width: 70rem; margin: 2rem auto;
       padding: 0 1rem; line-height: 1.45; color: #222; }
table { border-collapse: collapse; margin: 0.5rem 0 1rem; font-size: 0.92rem; }
th, td { border: 1px solid #ccc; padding: 0.25rem 0.6rem; text-align: right; }
th:first-child, td:first-child { text-align: left; }
th { background: #f3f3f3; }
caption { caption-side: bottom; font-size: 0.85rem; color: #555; padding-top: 0.3rem; }
figure { margin: 1rem 0 2rem; }
figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: 0.88rem; color: #555; }
code { background: #f5f5f5; padding: 0 0.2rem; }
"""


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|")


def to_markdown(blocks: Sequence[Block]) -> str:
    parts: list[str] = []
    for block in blocks:
        match block:
            case Heading(text, level):
                parts.append(f"{'#' * level} {text}")
            case Paragraph(text):
                parts.append(text)
            case Bullets(items):
                parts.append("\n".join(f"- {item}" for item in items))
            case Table(header, rows, caption):
                lines = ["| " + " | ".join(_md_cell(h) for h in header) + " |"]
                lines.append("|" + "|".join("---" for _ in header) + "|")
                lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
                if caption:
                    lines += ["", f"*{caption}*"]
                parts.append("\n".join(lines))
            case Image(path, alt, caption):
                parts.append(f"![{alt}]({path})" + (f"\n\n*{caption}*" if caption else ""))
    return "\n\n".join(parts) + "\n"


def _inline(text: str) -> str:
    return _CODE.sub(r"<code>\1</code>", html.escape(text))


def to_html(blocks: Sequence[Block], title: str) -> str:
    body: list[str] = []
    for block in blocks:
        match block:
            case Heading(text, level):
                body.append(f"<h{level}>{_inline(text)}</h{level}>")
            case Paragraph(text):
                body.append(f"<p>{_inline(text)}</p>")
            case Bullets(items):
                body.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in items) + "</ul>")
            case Table(header, rows, caption):
                head = "".join(f"<th>{_inline(h)}</th>" for h in header)
                cells = "".join(
                    "<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in row) + "</tr>"
                    for row in rows
                )
                cap = f"<caption>{_inline(caption)}</caption>" if caption else ""
                body.append(
                    f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{cells}</tbody></table>"
                )
            case Image(path, alt, caption):
                cap = f"<figcaption>{_inline(caption)}</figcaption>" if caption else ""
                body.append(
                    f'<figure><img src="{html.escape(path)}" alt="{html.escape(alt)}">{cap}</figure>'
                )
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n<style>{_STYLE}</style>\n</head>\n<body>\n"
        + "\n".join(body)
        + "\n</body>\n</html>\n"
    )
