"""Read back a diffusion_fuse HTML report (verify/html.py) with the standard library's html.parser.

``parse(text)`` returns every element as ``(tag, attrs)`` in document order and checks that the
document is well formed (every non-void element closed, in order) and self-contained (no
scripts, stylesheets, images or links to other documents).
"""

from __future__ import annotations

import dataclasses
from html.parser import HTMLParser

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


@dataclasses.dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    text: str = ""

    @property
    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def data(self, name: str) -> str | None:
        return self.attrs.get(f"data-{name}")


class _Parser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[Element] = []
        self.stack: list[tuple[str, Element]] = []
        self.errors: list[str] = []

    def handle_starttag(self, tag, attrs):
        el = Element(tag, {k: v or "" for k, v in attrs})
        self.elements.append(el)
        self._check_external(el)
        if tag not in VOID:
            self.stack.append((tag, el))

    def handle_startendtag(self, tag, attrs):
        el = Element(tag, {k: v or "" for k, v in attrs})
        self.elements.append(el)
        self._check_external(el)

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1][0] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1][0] if self.stack else 'nothing'}")
            return
        self.stack.pop()

    def handle_data(self, data):
        for _, el in self.stack:
            el.text += data

    def _check_external(self, el: Element) -> None:
        if el.tag in ("script", "link", "img", "iframe", "object", "embed"):
            self.errors.append(f"external or active element <{el.tag}>")
        for k in ("src", "href"):
            v = el.attrs.get(k, "")
            if v and not v.startswith("#"):
                self.errors.append(f"<{el.tag} {k}={v!r}> points outside the file")


def parse(text: str) -> list[Element]:
    p = _Parser()
    p.feed(text)
    p.close()
    if p.stack:
        p.errors.append(f"unclosed: {[t for t, _ in p.stack]}")
    assert not p.errors, p.errors[:5]
    return p.elements


def select(elements: list[Element], tag: str, cls: str | None = None) -> list[Element]:
    return [e for e in elements if e.tag == tag and (cls is None or cls in e.classes)]
