"""Markup → plain text, one function per format the corpus sources ship.

Every converter returns text in one normal form (see :func:`normalize`): NFC Unicode, no
control characters, single spaces inside a line, paragraphs separated by exactly one blank
line. Code is dropped where the markup marks it (``<pre>``, highlighted blocks, POD verbatim
paragraphs, roff ``.nf``/``.EX`` blocks, wiki ``<pre>``/``<syntaxhighlight>``); the corpus
quality filter (``adahop.harness.corpus.quality``) removes documents where unmarked code still dominates.

Formats and why each one: HTML (Sphinx, DocBook and AsciiDoc renderings: the rendered form
has every reST role, substitution and include resolved, so no reST or texinfo parser is
needed — the GNU texinfo manuals are not in Debian main anyway), POD (perl-doc), roff man
pages (manpages, manpages-dev), MediaWiki (gensim's Wikipedia sample), dictd databases
(GCIDE, the Jargon File, the Devil's Dictionary) and R's serialization format (Jane Austen's
novels in r-cran-janeaustenr).
"""

from __future__ import annotations

import html as _html
import re
import struct
import unicodedata
import zlib

# --------------------------------------------------------------------------- normal form

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b\ufeff]")
_SPACES = re.compile(r"[ \t\u00a0\u2000-\u200a\u202f\u3000]+")
_BLANKS = re.compile(r"\n{3,}")


def normalize(text: str) -> str:
    """Normal form of every cleaned document.

    NFC, ``\\r\\n``/``\\r`` → ``\\n``, form feeds and other control characters dropped, runs of
    spaces/tabs → one space, lines stripped, at most one blank line in a row, no blank line at
    either end. Equivalent to ``"\\n".join(l.strip() for l in lines)`` plus those rules.
    """
    text = unicodedata.normalize("NFC", text.replace("\r\n", "\n").replace("\r", "\n"))
    text = _CONTROL.sub("", text)
    lines = [_SPACES.sub(" ", line).strip() for line in text.split("\n")]
    return _BLANKS.sub("\n\n", "\n".join(lines)).strip("\n")


def reflow(text: str) -> str:
    """Join hard-wrapped lines inside each paragraph (blank-line separated) with spaces."""
    paras = re.split(r"\n\s*\n", text)
    return "\n\n".join(" ".join(p.split()) for p in paras if p.strip())


# --------------------------------------------------------------------------- HTML

# Elements whose text is never prose: code, navigation, tables, forms, page chrome.
_HTML_DROP_TAGS = ("script", "style", "pre", "table", "nav", "header", "footer", "form", "head",
                   "noscript", "svg", "math", "button", "select", "textarea")
# Sphinx / DocBook / AsciiDoc classes of chrome and code (matched as whole class words).
_HTML_DROP_CLASSES = ("highlight", "sphinxsidebar", "related", "headerlink", "navheader",
                      "navfooter", "toc", "footer", "sig", "breadcrumbs", "toctree-wrapper",
                      "listingblock", "literallayout", "programlisting", "screen", "synopsis",
                      "cmdsynopsis", "funcsynopsis", "literal-block", "doctest", "linenodiv",
                      "menu", "searchmenu", "fancy_toc", "topbar")
# Containers of the main text, most specific first; the first that exists is used.
_HTML_MAIN = ('//div[@role="main"]', '//div[@id="yui-main"]', '//div[@id="column1"]',
              '//div[@id="docs-body"]', '//div[contains(@class, "mainContent")]', '//main',
              '//div[@class="body"]', '//div[@id="content"]', '//div[@class="book"]',
              '//div[@class="chapter"]', '//body')
_HTML_BLOCKS = frozenset(("p", "div", "section", "article", "h1", "h2", "h3", "h4", "h5",
                          "h6", "li", "dt", "dd", "dl", "ul", "ol", "blockquote", "br", "hr",
                          "figcaption", "caption", "title", "aside", "main", "body"))


def html_to_text(markup: str | bytes) -> str:
    """Visible prose of an HTML page (bytes are decoded by the page's own charset).

    Keeps the main container (Sphinx ``div[role=main]``, DocBook ``div.book``/``chapter``,
    AsciiDoc ``div#content``, else ``body``), drops code, tables and navigation (see
    ``_HTML_DROP_*``), and makes each block element a paragraph. Equivalent to a browser's
    reader view saved as text, minus code blocks.
    """
    import lxml.etree
    import lxml.html

    if isinstance(markup, str):
        markup = markup.encode("utf-8")
    if not markup.strip():
        return ""
    root = lxml.html.fromstring(markup)
    lxml.etree.strip_elements(root, lxml.etree.Comment, lxml.etree.ProcessingInstruction,
                              *_HTML_DROP_TAGS, with_tail=False)
    main = next((found[0] for xp in _HTML_MAIN if (found := root.xpath(xp))), root)
    drop_xpath = " | ".join(
        f'.//*[contains(concat(" ", normalize-space(@class), " "), " {c} ")]'
        for c in _HTML_DROP_CLASSES)
    for el in main.xpath(drop_xpath):
        parent = el.getparent()
        if parent is not None:
            # Keep the tail: it is text of the parent that follows the dropped element.
            prev = el.getprevious()
            if el.tail:
                if prev is not None:
                    prev.tail = (prev.tail or "") + el.tail
                else:
                    parent.text = (parent.text or "") + el.tail
            parent.remove(el)
    pieces: list[str] = []

    def walk(el) -> None:
        tag = el.tag if isinstance(el.tag, str) else ""
        block = tag in _HTML_BLOCKS
        if block:
            pieces.append("\n\n")
        if el.text:
            pieces.append(el.text.replace("\n", " "))
        for child in el:
            walk(child)
            if child.tail:
                pieces.append(child.tail.replace("\n", " "))
        if block:
            pieces.append("\n\n")

    walk(main)
    text = "".join(pieces)
    return normalize("\n\n".join(p for p in (" ".join(s.split()) for s in text.split("\n\n")) if p))


# --------------------------------------------------------------------------- POD (perl-doc)

# X<< text >> with 2-4 brackets (the text may hold single < and >), innermost depth first.
_POD_CODE_DEEP = [re.compile(rf"([A-Z]){'<' * d}\s(.*?)\s{'>' * d}", re.S) for d in (2, 3, 4)]
_POD_CODE_SIMPLE = re.compile(r"([A-Z])<([^<>]*)>")
_POD_ENTITIES = {"lt": "<", "gt": ">", "verbar": "|", "sol": "/", "quot": '"', "amp": "&"}


def _pod_code(letter: str, body: str) -> str:
    if letter in "XZ":  # index entries and zero-width markers carry no text
        return ""
    if letter == "E":
        if body.isdigit():
            return chr(int(body))
        if body.startswith("0x"):
            return chr(int(body, 16))
        return _POD_ENTITIES.get(body, _html.unescape(f"&{body};"))
    if letter == "L":
        # L<text|target> shows text; L<name/"section"> and L<"section"> show their words.
        if "|" in body:
            return body.split("|", 1)[0]
        return body.replace('"', "").replace("/", " ").strip()
    return body  # B, I, C, F, S: font changes only


def _pod_inline(text: str) -> str:
    prev = None
    while prev != text:
        prev = text
        for pattern in _POD_CODE_DEEP:
            text = pattern.sub(lambda m: _pod_code(m.group(1), m.group(2)), text)
        text = _POD_CODE_SIMPLE.sub(lambda m: _pod_code(m.group(1), m.group(2)), text)
    return text


def pod_to_text(source: str) -> str:
    """Prose of a POD document: headings and item labels kept, verbatim (code) paragraphs and
    non-text ``=begin`` blocks dropped, formatting codes (``B<>``, ``L<|>``, ``E<>``, ``X<>``,
    ``<< >>`` forms) resolved. Equivalent to ``pod2text`` without the indented code."""
    out: list[str] = []
    skip_block = None  # the format of an =begin block being skipped
    in_pod = True
    for para in re.split(r"\n[ \t]*\n", source.replace("\r\n", "\n")):
        if not para.strip():
            continue
        command = re.match(r"=(\w+)\s*(.*)", para, re.S)
        if command:
            cmd, rest = command.groups()
            in_pod = cmd != "cut"  # any other command (re)starts POD
            if cmd == "begin":
                fmt = rest.split()[0] if rest.split() else ""
                skip_block = None if fmt.lower() in ("text", "") else fmt
            elif cmd == "end":
                skip_block = None
            elif cmd.startswith("head") or cmd == "item":
                label = rest.strip()
                if cmd == "item" and label in ("*", ""):
                    continue
                if cmd == "item" and label.startswith("* "):
                    label = label[2:]
                if skip_block is None:
                    out.append(" ".join(_pod_inline(label).split()))
            continue
        if not in_pod or skip_block is not None or para[0] in " \t":
            continue  # code outside POD, a skipped =begin block, or a verbatim paragraph
        out.append(" ".join(_pod_inline(para).split()))
    return normalize("\n\n".join(p for p in out if p))


# --------------------------------------------------------------------------- roff (man pages)

_ROFF_NAMED = {"em": "—", "en": "–", "aq": "'", "dq": '"', "lq": "“", "rq": "”", "oq": "‘",
               "cq": "’", "bu": "•", "co": "©", "rg": "®", "tm": "™", "mu": "×", "de": "°",
               "hy": "-", "ti": "~", "ha": "^", "rs": "\\", "bv": "|", "pl": "+", "mi": "-",
               "eq": "=", "<=": "≤", ">=": "≥", "!=": "≠", "->": "→", "<-": "←", "fm": "′",
               "sq": "□", "ga": "`", "aa": "´", "ul": "_", "+-": "±", "dg": "†"}
_ROFF_ESCAPE = re.compile(
    r"\\(?:f(?:\[[^\]]*\]|\(..|.)"   # font changes \fB \f(CW \f[I]
    r"|s[+-]?\d"                     # size changes \s-1
    r"|\((..)"                       # \(xx named glyph
    r"|\[([^\]]*)\]"                 # \[name] named glyph
    r"|\*(?:\((..)|\[([^\]]*)\]|(.))"  # strings \*(lq \*[name] \*R
    r"|([-e&|^~ c0.:'`%!\\\"]))"     # single-character escapes
)
_ROFF_SINGLE = {"-": "-", "e": "\\", "\\": "\\", " ": " ", "~": " ", "0": " ", ".": ".",
                "'": "´", "`": "`"}
# Sections whose text is not prose: call signatures, cross references, release boilerplate.
_ROFF_SKIP_SECTIONS = ("SYNOPSIS", "SEE ALSO", "COLOPHON")
_ROFF_FONT_MACROS = ("B", "I", "BR", "RB", "IR", "RI", "BI", "IB", "SM", "SB")
_ROFF_PARA_MACROS = ("PP", "LP", "P", "TP", "IP", "HP", "TQ", "sp", "br", "SH", "SS")


def _roff_args(line: str) -> list[str]:
    """Split a macro line's arguments, honouring double quotes."""
    return [a[1:-1] if a.startswith('"') else a for a in re.findall(r'"[^"]*"?|\S+', line)]


def _roff_escapes(text: str) -> str:
    def repl(m: re.Match) -> str:
        named = m.group(1) or m.group(2) or m.group(3) or m.group(4)
        if named is not None:
            return _ROFF_NAMED.get(named, "")
        if m.group(5) is not None:
            return {"R": "®", "lq": "“", "rq": "”"}.get(m.group(5), "")
        return _ROFF_SINGLE.get(m.group(6) or "", "")

    return _ROFF_ESCAPE.sub(repl, text)


def roff_to_text(source: str) -> str:
    """Prose of a man page (man macros): NAME/DESCRIPTION/... kept, SYNOPSIS, SEE ALSO and
    COLOPHON dropped, ``.nf``/``.EX`` and ``.TS`` blocks (code, tables) dropped, font macros
    and escapes resolved. A ``.so`` redirect page returns "". Equivalent to ``man -Tutf8`` with
    the layout removed."""
    if source.lstrip().startswith(".so "):
        return ""
    out: list[str] = []
    para: list[str] = []
    skip_section = False
    skip_block = None

    def flush() -> None:
        if para and not skip_section:
            out.append(" ".join(" ".join(para).split()))
        para.clear()

    for raw in source.replace("\r\n", "\n").split("\n"):
        line = raw.rstrip()
        if line.startswith((".\\\"", "'\\\"", '\\"')) or line in (".", "'"):
            continue
        while line.endswith("\\") and not line.endswith("\\\\"):
            line = line[:-1]  # continuation: the next physical line joins this one
        if skip_block:
            if line.startswith(skip_block):
                skip_block = None
            continue
        if line.startswith((".", "'")):
            macro, _, rest = line[1:].strip().partition(" ")
            if macro in ("nf", "EX"):
                flush()
                skip_block = ".fi" if macro == "nf" else ".EE"
            elif macro == "TS":
                flush()
                skip_block = ".TE"
            elif macro == "de":
                skip_block = ".."
            elif macro in ("SH", "SS"):
                flush()
                title = _roff_escapes(" ".join(_roff_args(rest))).strip()
                if macro == "SH":
                    skip_section = title.upper() in _ROFF_SKIP_SECTIONS
                if not skip_section:
                    out.append(title.capitalize() if title.isupper() else title)
            elif macro in _ROFF_FONT_MACROS:
                args = _roff_args(rest)
                joined = "".join(args) if len(macro) == 2 and macro != "SM" else " ".join(args)
                para.append(_roff_escapes(joined))
            elif macro in _ROFF_PARA_MACROS:
                flush()
            continue  # every other request (.TH .in .RS .UR .ft ...) is layout
        para.append(_roff_escapes(line))
    flush()
    return normalize("\n\n".join(p for p in out if p))


# --------------------------------------------------------------------------- MediaWiki

_WIKI_NESTED = (re.compile(r"\{\{(?:(?!\{\{|\}\}).)*\}\}", re.S),  # innermost template
                re.compile(r"\{\|(?:(?!\{\||\|\}).)*\|\}", re.S))  # innermost table
_WIKI_LINK = re.compile(r"\[\[([^\[\]|]*)(?:\|([^\[\]]*))?\]\]")
_WIKI_DROP_NS = re.compile(r"^\s*:?\s*(file|image|category|media|[a-z]{2,3}(-[a-z]+)?)\s*:", re.I)
_WIKI_REF = re.compile(r"<ref[^>/]*/>|<ref[^>]*>.*?</ref>", re.S | re.I)
_WIKI_CODE = re.compile(r"<(pre|source|syntaxhighlight|math|code|gallery|timeline)[^>]*>.*?</\1>",
                        re.S | re.I)


def wikitext_to_text(source: str) -> str:
    """Prose of a MediaWiki article: templates, tables, references, files, categories and
    interlanguage links removed; ``[[target|label]]`` → label; headings, lists and bold/italic
    quotes reduced to their words; HTML entities decoded. Equivalent to gensim's
    ``filter_wiki`` keeping paragraph breaks."""
    text = re.sub(r"<!--.*?-->", "", source, flags=re.S)
    text = _WIKI_REF.sub("", _WIKI_CODE.sub("", text))
    for pattern in _WIKI_NESTED:
        prev = None
        while prev != text:
            prev, text = text, pattern.sub("", text)

    def link(m: re.Match) -> str:
        target, label = m.group(1), m.group(2)
        if _WIKI_DROP_NS.match(target):
            return ""
        return label if label is not None else target

    prev = None
    while prev != text:
        prev, text = text, _WIKI_LINK.sub(link, text)
    text = re.sub(r"\[(?:https?|ftp)://[^\s\]]+\s+([^\]]*)\]", r"\1", text)
    text = re.sub(r"\[(?:https?|ftp)://[^\]]*\]", "", text)
    text = re.sub(r"'{2,}", "", text)
    text = re.sub(r"__[A-Z]+__", "", text)
    text = re.sub(r"<[^>]{0,200}>", "", text)
    text = _html.unescape(text)
    lines = []
    for line in text.split("\n"):
        line = line.strip()
        if line.startswith(("|", "!", "{|", "|}")):
            continue  # remnants of a malformed table
        heading = re.fullmatch(r"(=+)\s*(.*?)\s*\1", line)
        if heading:
            lines.extend(["", heading.group(2), ""])
            continue
        lines.append(re.sub(r"^[*#:;]+\s*", "", line))
    return normalize("\n".join(lines))


# --------------------------------------------------------------------------- dictd

_B64 = {c: i for i, c in enumerate("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")}


def _dictd_number(code: str) -> int:
    value = 0
    for c in code:
        value = value * 64 + _B64[c]
    return value


def dictd_entries(index: str, data: bytes) -> list[str]:
    """The entries of a dictd database, in data-file order, each as cleaned text.

    ``index``: the ``.index`` file (``headword<TAB>offset<TAB>length``, numbers in dictd's
    base64); ``data``: the uncompressed ``.dict`` bytes. Database metadata entries
    (``00database*``, ``00-database-*``) are skipped; entries that several headwords share
    appear once. Equivalent to ``dict -d DB`` for every headword, deduplicated.
    """
    spans = set()
    for line in index.splitlines():
        parts = line.split("\t")
        if len(parts) < 3 or parts[0].startswith(("00database", "00-database")):
            continue
        spans.add((_dictd_number(parts[1]), _dictd_number(parts[2])))
    return [dictd_entry_to_text(data[o:o + n].decode("utf-8", "replace")) for o, n in sorted(spans)]


# GCIDE's ASCII accent codes: ['e] é, [=a] ā, [a^] ă, ["o] ö, [ae] æ, ... → the base letters
# (the diacritic is dropped); longer codes ([imac], [root], [asl]) are symbols and go.
_GCIDE_ACCENT = re.compile(r"\[[=\-~^\"'`.]?([A-Za-z]{1,2})[\^~]?\]")
_GCIDE_SYMBOL = re.compile(r"\[(?:imac|aum|eth|root|add|asl|cced|thorn|oomac|ddot|sec|deg|frac\d+)\]")
# A pronunciation: a parenthesised or backslashed word with stress marks (* ` ").
_DICT_PRONUNCIATION = re.compile(r"\\[^\\\n]{1,80}\\|\((?=[^()\s]*[*`\"])[^()\s]+\)")


def dictd_entry_to_text(entry: str) -> str:
    """One dictionary entry as prose: pronunciations (``\\Ab*do"men\\``,
    ``(p[o^]l`y*syn)``), source tags (``[1913 Webster]``, ``[PJC]``), GCIDE accent codes
    (``['e]`` → ``e``) and cross-reference braces (``{word}``) removed, hard wraps joined."""
    entry = _DICT_PRONUNCIATION.sub("", entry)
    entry = re.sub(r"\[[^\]\n]*(?:Webster|WordNet|PJC|Century|Chambers)[^\]\n]*\]", "", entry)
    entry = _GCIDE_SYMBOL.sub("", _GCIDE_ACCENT.sub(r"\1", entry))
    entry = re.sub(r"\{([^{}]*)\}", r"\1", entry)
    entry = re.sub(r"[ \t]+([,;:.])", r"\1", entry)  # the space a removed key leaves
    return reflow(normalize(entry))


# --------------------------------------------------------------------------- R serialization

# SEXP type codes of R's serialization format (R Internals, "Serialization Formats").
_R_NIL, _R_SYM, _R_LIST, _R_CHAR, _R_LGL, _R_INT, _R_REAL, _R_STR, _R_VEC = 254, 1, 2, 9, 10, 13, 14, 16, 19
_R_REF = 255
_R_UTF8 = 1 << 15  # CHARSXP "gp" bit: the string is UTF-8


class RVector(list):
    """An R vector read by :func:`r_unserialize`: a list with its R attributes (``attrs``)."""

    def __init__(self, items, attrs=None):
        super().__init__(items)
        self.attrs = attrs or {}

    def named(self) -> dict:
        """The vector as ``{name: element}`` (needs a ``names`` attribute)."""
        if "names" not in self.attrs:
            raise ValueError("R vector has no names attribute")
        return dict(zip(self.attrs["names"], self))


class _RReader:
    """A reader for the XDR ("X\\n") form of R's serialization, enough for data objects:
    NULL, symbols, pairlists, character, logical, integer, double and generic vectors, with
    their attributes. Other types raise ValueError naming the type code."""

    def __init__(self, buf: bytes, pos: int):
        self.buf, self.pos, self.refs = buf, pos, []

    def int(self) -> int:
        (v,) = struct.unpack_from(">i", self.buf, self.pos)
        self.pos += 4
        return v

    def read(self):
        flags = self.int()
        kind = flags & 0xFF
        if kind == _R_NIL:
            return None
        if kind == _R_REF:
            return self.refs[(flags >> 8) - 1]
        if kind == _R_SYM:
            sym = self.read()
            self.refs.append(sym)
            return sym
        if kind == _R_LIST:  # a pairlist: (attr?, tag?, car, cdr) cells until NULL
            out = {}
            while kind == _R_LIST:
                if flags & 512:
                    self.read()
                tag = self.read() if flags & 1024 else len(out)
                out[tag] = self.read()
                flags = self.int()
                kind = flags & 0xFF
            if kind != _R_NIL:
                raise ValueError(f"R serialization: pairlist ends in type {kind}")
            return out
        if kind == _R_CHAR:
            n = self.int()
            if n == -1:
                return None  # NA_character_
            s = self.buf[self.pos:self.pos + n].decode("utf-8" if flags & _R_UTF8 else "latin-1")
            self.pos += n
            return s
        if kind in (_R_STR, _R_VEC, _R_LGL, _R_INT, _R_REAL):
            n = self.int()
            if kind in (_R_STR, _R_VEC):
                items = [self.read() for _ in range(n)]
            else:
                fmt = f">{n}{'d' if kind == _R_REAL else 'i'}"
                items = struct.unpack_from(fmt, self.buf, self.pos)
                self.pos += struct.calcsize(fmt)
            return RVector(items, self.read() if flags & 512 else None)
        raise ValueError(f"R serialization: unsupported SEXP type {kind} at byte {self.pos - 4}")


def r_unserialize(buf: bytes):
    """Decode an XDR-format R serialization (format versions 2 and 3) into Python values:
    vectors → :class:`RVector`, pairlists → dict, strings → str. Equivalent to R's
    ``unserialize`` for data objects."""
    if buf[:2] != b"X\n":
        raise ValueError("R serialization: only the XDR format ('X\\n' header) is supported")
    reader = _RReader(buf, 2)
    version = reader.int()
    reader.int(), reader.int()  # writer's R version, minimal reader version
    if version == 3:
        n = reader.int()
        reader.pos += n  # skip the native encoding name
    elif version != 2:
        raise ValueError(f"R serialization: unsupported format version {version}")
    return reader.read()


def r_lazyload_objects(rdx: bytes, rdb: bytes) -> dict[str, object]:
    """All objects of an R lazy-load database (``Rdata.rdx`` + ``Rdata.rdb``) by name.

    The index is a gzip-compressed serialization of ``list(variables = list(name =
    c(offset, length)), ...)``; each record in the database is a 4-byte big-endian length and
    a zlib stream (R's default). Equivalent to R's ``lazyLoad``.
    """
    import gzip

    index = r_unserialize(gzip.decompress(rdx)).named()
    out = {}
    for name, (offset, length) in index["variables"].named().items():
        blob = rdb[int(offset):int(offset) + int(length)]
        if blob[4:5] in (b"2", b"3", b"Z"):
            raise ValueError("R lazy-load: only zlib-compressed databases are supported")
        out[name] = r_unserialize(zlib.decompress(blob[4:]))
    return out
