"""Corpus, tokenizer and token data (adahop.harness.markup, adahop.harness.corpus, adahop.harness.data). No network:
markup snippets are copied from the real packages, the corpus fixture is generated here."""

import gzip
import hashlib
import json
import lzma
import os
import random
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from adahop.harness import corpus, data, markup

# --------------------------------------------------------------------------- markup, one format each

SPHINX_HTML = """<html><head><title>9. Classes</title><script>var x = 1;</script></head><body>
<div class="related" role="navigation"><ul><li><a href="index.html">Python 3.11 docs</a></li></ul></div>
<div class="body" role="main">
<section id="classes">
<span id="tut-classes"></span><h1><span class="section-number">9. </span>Classes<a class="headerlink"
href="#classes" title="Permalink to this heading">¶</a></h1>
<p>Classes provide a means of bundling data and functionality together.  Creating
a new class creates a new <em>type</em> of object, allowing new <em>instances</em> of that
type to be made.</p>
<div class="highlight-python3 notranslate"><div class="highlight"><pre><span></span><span class="k">def</span>
<span class="nf">scope_test</span><span class="p">():</span></pre></div></div>
<p>In C++ terminology, normally class members are <em>public</em> (except see below <a class="reference
internal" href="#tut-private"><span class="std std-ref">Private Variables</span></a>), and all member
functions are <em>virtual</em>.</p>
</section></div>
<div class="sphinxsidebar" role="navigation"><h3>Table of Contents</h3></div>
</body></html>"""

DOCBOOK_HTML = b"""<?xml version="1.0" encoding="UTF-8" standalone="no"?>
<!DOCTYPE html PUBLIC "-//W3C//DTD XHTML 1.0 Transitional//EN" "http://www.w3.org/TR/xhtml1/DTD/xhtml1-transitional.dtd"><html xmlns="http://www.w3.org/1999/xhtml"><head><meta http-equiv="Content-Type" content="text/html; charset=UTF-8" /><title>2.6. Joins Between Tables</title></head><body id="docContent" class="container-fluid col-10"><div class="navheader"><table width="100%" summary="Navigation header"><tr><th colspan="5" align="center">2.6. Joins Between Tables</th></tr><tr><td width="10%" align="left"><a accesskey="p" href="tutorial-select.html" title="2.5. Querying a Table">Prev</a> </td></tr></table><hr /></div><div class="sect1" id="TUTORIAL-JOIN"><div class="titlepage"><div><div><h2 class="title" style="clear: both">2.6. Joins Between Tables</h2></div></div></div><a id="id-1.4.4.7.2" class="indexterm"></a><p>
    Thus far, our queries have only accessed one table at a time.
    Queries can access multiple tables at once.</p><pre class="programlisting">SELECT * FROM weather, cities WHERE city = name;</pre><p>Observe two things about the r\xc3\xa9sult set.</p></div></body></html>"""


def test_html_sphinx_keeps_prose_drops_code_and_chrome():
    text = markup.html_to_text(SPHINX_HTML)
    assert text.split("\n\n") == [
        "9. Classes",
        "Classes provide a means of bundling data and functionality together. Creating a new class "
        "creates a new type of object, allowing new instances of that type to be made.",
        "In C++ terminology, normally class members are public (except see below Private Variables), "
        "and all member functions are virtual.",
    ]


def test_html_docbook_xhtml_drops_navigation_tables_and_programlisting():
    text = markup.html_to_text(DOCBOOK_HTML)
    assert text == ("2.6. Joins Between Tables\n\nThus far, our queries have only accessed one table at a "
                    "time. Queries can access multiple tables at once.\n\nObserve two things about the "
                    "résult set.")


def test_html_empty_page_is_empty():
    assert markup.html_to_text(b"  ") == ""


POD = """=head1 NAME

perlsub - Perl subroutines

=head1 SYNOPSIS

To declare subroutines:

    sub NAME;                     # A "forward" declaration.
    sub NAME(PROTO);              #  ditto, but with prototypes

=head1 DESCRIPTION

Like many languages, Perl provides for user-defined subroutines.
These may be located anywhere in the main program, loaded in from
other files via the C<do>, C<require>, or C<use> keywords, or see
L<perlref/"Function Templates"> and L<the manual|perlmod>. X<subroutine>
Use C<< $x->method >> when E<lt>anglesE<gt> matter.

=over 4

=item *

=item Signatures

Z<>Signatures name the B<parameters>.

=back

=begin html

<p>Only for HTML</p>

=end html

=cut

sub code_after_cut { 1 }
"""


def test_pod_headings_prose_and_codes_without_verbatim():
    assert markup.pod_to_text(POD).split("\n\n") == [
        "NAME", "perlsub - Perl subroutines", "SYNOPSIS", "To declare subroutines:", "DESCRIPTION",
        "Like many languages, Perl provides for user-defined subroutines. These may be located anywhere "
        "in the main program, loaded in from other files via the do, require, or use keywords, or see "
        "perlref Function Templates and the manual. Use $x->method when <angles> matter.",
        "Signatures", "Signatures name the parameters.",
    ]


ROFF = r""".\" SPDX-License-Identifier: Linux-man-pages-copyleft
.TH open 2 2023-02-05 "Linux man-pages 6.03"
.SH NAME
open, openat, creat \- open and possibly create a file
.SH SYNOPSIS
.nf
.B #include <fcntl.h>
.fi
.SH DESCRIPTION
The
.BR open ()
system call opens the file specified by
.IR pathname .
If the specified file does not exist,
it may optionally be created by \fBopen\fP(),
a \(lqsmall\(rq call \(em see below.
.PP
.EX
fd = open("x", O_RDONLY);
.EE
.TS
l l.
a	b
.TE
Flags
.I must
be given.
.SH SEE ALSO
.BR close (2)
"""


def test_roff_man_page_prose_without_synopsis_code_tables_see_also():
    assert markup.roff_to_text(ROFF).split("\n\n") == [
        "Name", "open, openat, creat - open and possibly create a file", "Description",
        "The open() system call opens the file specified by pathname. If the specified file does not "
        "exist, it may optionally be created by open(), a “small” call — see below.",
        "Flags must be given.",
    ]


def test_roff_so_redirect_page_is_empty():
    assert markup.roff_to_text(".so man2/open.2\n") == ""


WIKI = """{{Infobox Greek deity | name = Achilles | image = Achilles.jpg}}
In [[Greek mythology]], '''Achilles''' (<ref name="a">Homer</ref>{{lang|grc|Ἀχιλλεύς}}) was a
Greek hero of the [[Trojan War|war of Troy]]<!-- hidden -->.[[File:Achilles.jpg|thumb|A [[vase]]]]

== Etymology ==
* Achilles' name can be analyzed as a combination of [http://example.org grief] and people.
{| class="wikitable"
| cell || cell
|}
[[Category:Greek heroes]]
[[de:Achilleus]]
"""


def test_wikitext_links_templates_refs_tables_removed():
    assert markup.wikitext_to_text(WIKI).split("\n\n") == [
        "In Greek mythology, Achilles () was a\nGreek hero of the war of Troy.",
        "Etymology",
        "Achilles' name can be analyzed as a combination of grief and people.",
    ]


GCIDE_ENTRY = """Abdicator \\Ab"di*ca`tor\\, n.
   One who abdicates.
   [1913 Webster]

   {Abdication} of the throne.

Polysynthetic (p[o^]l`[i^]*s[i^]n*th[e^]t"[i^]k), a. [Poly- + synthetic.]
   Characterized by polysynthesis; as, ac['e]reux, antenn[ae]. [PJC]
"""


def test_dictd_entry_pronunciation_tags_accents_braces():
    assert markup.dictd_entry_to_text(GCIDE_ENTRY).split("\n\n") == [
        "Abdicator, n. One who abdicates.", "Abdication of the throne.",
        "Polysynthetic, a. [Poly- + synthetic.] Characterized by polysynthesis; as, acereux, antennae."]


def test_dictd_index_offsets_in_base64_and_metadata_skipped():
    body = b"00-database-info\nabout\nalpha\n   first letter\nbeta\n   second letter\n"
    off_a, off_b = body.index(b"alpha"), body.index(b"beta")

    def b64(n):
        digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
        return digits[n // 64] + digits[n % 64] if n >= 64 else digits[n]

    index = (f"00-database-info\tA\t{b64(off_a)}\nalpha\t{b64(off_a)}\t{b64(off_b - off_a)}\n"
             f"a\t{b64(off_a)}\t{b64(off_b - off_a)}\nbeta\t{b64(off_b)}\t{b64(len(body) - off_b)}\n")
    assert markup.dictd_entries(index, body) == ["alpha first letter", "beta second letter"]


def _r_xdr_character_vector(strings, names=None):
    """R's serialize(x, NULL, xdr=TRUE) of a character vector, written from the R Internals spec."""
    def charsxp(s):
        raw = s.encode("utf-8")
        return struct.pack(">ii", 9 | (1 << 15), len(raw)) + raw

    flags = 16 | (512 if names else 0)
    out = b"X\n" + struct.pack(">iiii", 3, 0x040201, 0x030500, 5) + b"UTF-8"
    out += struct.pack(">ii", flags, len(strings)) + b"".join(charsxp(s) for s in strings)
    if names:
        out += struct.pack(">i", 2 | 1024) + struct.pack(">i", 1) + charsxp("names")
        out += struct.pack(">ii", 16, len(names)) + b"".join(charsxp(s) for s in names)
        out += struct.pack(">i", 254)
    return out


def test_r_unserialize_character_vector_with_names():
    value = markup.r_unserialize(_r_xdr_character_vector(["It is a truth", "", "Chapter 2"], ["a", "b", "c"]))
    assert list(value) == ["It is a truth", "", "Chapter 2"]
    assert value.named() == {"a": "It is a truth", "b": "", "c": "Chapter 2"}


def test_r_unserialize_rejects_ascii_format():
    with pytest.raises(ValueError, match="XDR"):
        markup.r_unserialize(b"A\n3\n")


def test_normalize_whitespace_controls_blank_lines():
    assert markup.normalize("\ufeff  a\t\tb \r\n\r\n\r\n\x0cc\u00a0 d  \n\n") == "a b\n\nc d"


def test_split_document_at_chapters():
    parts = list(corpus.split_document("emma", "EMMA\n\nCHAPTER I\n\nOne.\n\nCHAPTER II\n\nTwo.",
                                       corpus.SOURCES["austen"].split_pattern))
    assert parts == [("emma#000", "EMMA"), ("emma#001", "CHAPTER I\n\nOne."), ("emma#002", "CHAPTER II\n\nTwo.")]


# --------------------------------------------------------------------------- quality, dedup, split

WORDS = {
    "adj": "quiet old bright narrow ancient careful distant simple early common".split(),
    "noun": "river house garden letter window kernel driver morning village engine".split(),
    "verb": "opened followed described carried watched changed reached".split(),
}


def prose(rng: random.Random, sentences: int) -> str:
    out = []
    for _ in range(sentences):
        a, n1, n2, v, n3 = (rng.choice(WORDS["adj"]), rng.choice(WORDS["noun"]), rng.choice(WORDS["noun"]),
                            rng.choice(WORDS["verb"]), rng.choice(WORDS["noun"]))
        out.append(f"The {a} {n1} of the {n2} was {v} by a {n3} that is in the {rng.choice(WORDS['noun'])}.")
    return " ".join(out)


def test_quality_keeps_prose_rejects_short_code_foreign():
    rng = random.Random(0)
    assert corpus.quality(prose(rng, 20)) is None
    assert corpus.quality(prose(rng, 2)) == "short"
    code = "\n".join(f"int f{i}(int x) {{ return x + {i}; }}" for i in range(80))
    assert corpus.quality(code) in ("code", "not-english", "symbols")
    german = " ".join(["Der Fluss und das Haus wurden von einem Dorf gesehen, das im Garten liegt."] * 20)
    assert corpus.quality(german) == "not-english"
    repeated = "\n".join([prose(random.Random(1), 3)] * 10)
    assert corpus.quality(repeated) == "repetitive"


def test_near_duplicate_index_flags_small_edit_not_other_text():
    rng = random.Random(1)
    a = prose(rng, 40)
    b = prose(rng, 40)
    idx = corpus.NearDuplicateIndex(threshold=0.8)
    assert not idx.seen("a", a)
    edited = a.replace("river", "stream", 1)
    assert idx.seen("a2", edited)
    assert not idx.seen("b", b)


def test_validation_split_depends_on_id_only_and_matches_fraction():
    ids = [hashlib.sha256(str(i).encode()).hexdigest()[:16] for i in range(20000)]
    first = [corpus.is_validation(i, 0.05) for i in ids]
    assert [corpus.is_validation(i, 0.05) for i in reversed(ids)] == first[::-1]
    assert 0.045 < sum(first) / len(ids) < 0.055
    # A larger fraction only adds documents to val (a superset).
    assert all(corpus.is_validation(i, 0.1) for i, v in zip(ids, first) if v)


# --------------------------------------------------------------------------- sources: pinned versions

REPO = Path(__file__).resolve().parents[1]


def test_every_source_is_pinned_to_the_version_the_committed_full_corpus_was_built_from():
    built_from = json.loads((REPO / "results/corpus/gpu/full.json").read_text())["records"]
    versions = {r["name"]: (r["package"], r["version"]) for r in built_from if r["kind"] == "source"}
    assert set(versions) == set(corpus.FULL_SOURCES)
    for name, source in corpus.SOURCES.items():
        assert (source.package_name, source.version) == versions[name], name


def test_unpinned_source_refused():
    with pytest.raises(ValueError, match=r"not pinned to a version \(git-doc=VERSION\)"):
        corpus.Source("git", "deb", "git-doc", "html", ("*.html",), "GPL-2.0-only")
    with pytest.raises(ValueError, match=r"gensim==VERSION"):
        corpus.Source("wiki", "pypi", "gensim", "wiki", ("*.bz2",), "CC-BY-SA-3.0")


def _deb(directory, package, version):
    root = directory / "pkg"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN/control").write_text(
        f"Package: {package}\nVersion: {version}\nArchitecture: all\nMaintainer: adahop tests <t@t>\n"
        "Description: test package\n")
    out = directory / f"{package}_{version}_all.deb"
    subprocess.run(["dpkg-deb", "--build", "--root-owner-group", str(root), str(out)], check=True,
                   capture_output=True)
    return out


@pytest.mark.skipif(not shutil.which("dpkg-deb"), reason="needs dpkg-deb")
def test_fetch_refuses_a_cached_archive_of_another_version(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus, "_run", lambda cmd, cwd: pytest.fail(f"downloaded: {cmd}"))
    _deb(tmp_path / "cache/deb", "git-doc", "1:2.39.5-0+deb12u2")
    source = corpus.Source("git", "deb", "git-doc=1:2.39.5-0+deb12u3", "html", ("*.html",), "GPL")
    with pytest.raises(RuntimeError, match=r"is version 1:2.39.5-0\+deb12u2, the source pins "
                                           r"1:2.39.5-0\+deb12u3: delete it"):
        corpus.fetch(source, tmp_path / "cache")
    pinned = corpus.Source("git", "deb", "git-doc=1:2.39.5-0+deb12u2", "html", ("*.html",), "GPL")
    assert corpus.fetch(pinned, tmp_path / "cache").version == "1:2.39.5-0+deb12u2"


def test_fetch_asks_for_the_pinned_version_and_says_what_to_do_when_it_is_missing(tmp_path, monkeypatch):
    asked = []

    def apt(cmd, cwd):
        asked.append(cmd)
        raise RuntimeError("apt-get download git-doc=0.1 failed: E: Version '0.1' for 'git-doc' was not found")

    monkeypatch.setattr(corpus, "_run", apt)
    source = corpus.Source("git", "deb", "git-doc=0.1", "html", ("*.html",), "GPL")
    with pytest.raises(RuntimeError, match=r"(?s)git-doc=0.1 could not be downloaded. Run `apt-get update`.*"
                                           r"was not found"):
        corpus.fetch(source, tmp_path)
    assert asked == [["apt-get", "download", "git-doc=0.1"]]


# --------------------------------------------------------------------------- build + shards (fixture)

def fixture_documents(seed=0):
    rng = random.Random(seed)
    plays = [(f"play{i}.txt", prose(rng, 25) + "\n\nThe end of the play, and the café closed. 😀") for i in range(40)]
    poems = [(f"poem{i}.txt", prose(rng, 15)) for i in range(20)]
    poems.append(("copy.txt", "  " + plays[3][1].upper() + "  "))          # exact dup (case/space)
    poems.append(("edit.txt", plays[5][1].replace("river", "stream", 1)))  # near dup
    poems.append(("short.txt", "Too short."))
    return {"shakespeare": plays, "milton": poems}


def build(tmp, seed=0, vocab=320):
    cfg = corpus.CorpusConfig(sources=("shakespeare", "milton"), val_fraction=0.15)
    part = corpus.build_corpus(cfg, tmp, tmp / "cache", log=lambda s: None, documents=fixture_documents(seed))
    meta = data.write_shards(tmp, vocab_size=vocab)
    return part, meta


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("corpus")
    part, meta = build(tmp)
    return tmp, part, meta


def test_build_counts_dedup_and_drops(built):
    _, part, _ = built
    totals = part["totals"]
    assert totals["documents_read"] == 63
    assert totals["exact_duplicates"] == 1 and totals["near_duplicates"] == 1
    milton = next(r for r in part["sources"] if r["name"] == "milton")
    assert milton["documents"]["dropped_short"] == 1
    assert totals["documents_kept"] == 60 == totals["train_documents"] + totals["val_documents"]
    assert totals["val_documents"] > 0


def test_split_files_hold_the_hash_assigned_documents(built):
    tmp, _, _ = built
    for split in data.SPLITS:
        rows = [json.loads(line) for line in (tmp / "text" / f"{split}.jsonl").read_text().splitlines()]
        assert [r["id"] for r in rows] == sorted(r["id"] for r in rows)
        assert all(corpus.is_validation(r["id"], 0.15) == (split == "val") for r in rows)
        assert all(r["id"] == corpus.document_id(r["text"]) for r in rows)


def test_rerun_is_byte_identical(built, tmp_path):
    tmp, _, _ = built
    build(tmp_path)
    for name in ("text/train.jsonl", "text/val.jsonl", "tokenizer.json", "train.bin", "val.bin", "meta.json"):
        assert (tmp / name).read_bytes() == (tmp_path / name).read_bytes(), name


def test_tokenizer_training_is_deterministic(tmp_path):
    texts = [prose(random.Random(i), 30) for i in range(30)]
    a = data.train_tokenizer(texts, 400).to_str()
    assert data.train_tokenizer(iter(texts), 400).to_str() == a
    # Another process with one Rayon thread (and another hash seed) trains the same tokenizer.
    (tmp_path / "texts.json").write_text(json.dumps(texts))
    code = ("import json, sys; from adahop.harness.data import train_tokenizer; "
            "print(train_tokenizer(json.load(open(sys.argv[1])), 400).to_str(), end='')")
    env = {**os.environ, "RAYON_NUM_THREADS": "1", "PYTHONHASHSEED": "123"}
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "texts.json")], env=env,
                         capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout == a


def test_tokenizer_round_trip_and_special_tokens(built):
    tmp, _, meta = built
    tok = data.load_tokenizer(tmp)
    assert (meta["bos_id"], meta["eos_id"]) == (0, 1) and meta["dtype"] == "uint16"
    text = "The quiet river — naïve café, 東京 😀\n\n  tabs\tand  spaces."
    assert tok.decode(tok.encode(text, add_special_tokens=False).ids) == text
    assert tok.get_vocab_size() == meta["vocab_size"] <= 320


def test_tokenizer_loads_in_transformers(built):
    transformers = pytest.importorskip("transformers")
    tmp, _, _ = built
    fast = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp / "tokenizer.json"),
                                                bos_token=data.BOS_TOKEN, eos_token=data.EOS_TOKEN)
    ids = fast("The garden of the house.")["input_ids"]
    assert fast.decode(ids) == "The garden of the house." and fast.eos_token_id == 1


def test_shards_are_documents_each_followed_by_eos(built):
    tmp, _, meta = built
    tok = data.load_tokenizer(tmp)
    train = data.load_tokens(tmp, "train")
    docs = list(data.iter_documents(tmp / "text" / "train.jsonl"))
    expected = np.concatenate([np.array(tok.encode(d, add_special_tokens=False).ids + [1]) for d in docs])
    assert np.array_equal(np.asarray(train), expected)
    assert meta["tokens"]["train"] == len(train) and meta["documents"]["train"] == len(docs)


def test_load_tokens_is_read_only_memmap(built):
    tmp, _, meta = built
    val = data.load_tokens(tmp, "val")
    assert isinstance(val, np.memmap) and val.dtype == np.uint16 and val.shape == (meta["tokens"]["val"],)
    with pytest.raises(ValueError):
        val[0] = 3


def test_load_tokens_errors(built, tmp_path):
    tmp, _, _ = built
    with pytest.raises(FileNotFoundError, match="does not exist; build it"):
        data.load_tokens(tmp_path / "nowhere", "train")
    with pytest.raises(FileNotFoundError, match="meta.json"):
        data.load_tokens(tmp_path, "train")
    with pytest.raises(ValueError, match="split must be one of"):
        data.load_tokens(tmp, "test")
    (tmp_path / "meta.json").write_text((tmp / "meta.json").read_text())
    with pytest.raises(FileNotFoundError, match="val.bin"):
        data.load_tokens(tmp_path, "val")
    (tmp_path / "val.bin").write_bytes(b"\0\0")
    with pytest.raises(ValueError, match="inconsistent"):
        data.load_tokens(tmp_path, "val")


# --------------------------------------------------------------------------- batches

def test_token_batches_shapes_and_shifted_targets(built):
    tmp, _, _ = built
    x, y = next(data.TokenBatches(tmp, "train", seq_len=16, batch_size=4, seed=0))
    assert x.shape == y.shape == (4, 16) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    train = data.load_tokens(tmp, "train")
    starts = data.TokenBatches(tmp, "train", 16, 4, seed=0).starts(0)
    assert torch.equal(x[0], torch.from_numpy(train[starts[0]:starts[0] + 16].astype(np.int64)))


def test_token_batches_seeded_and_resumable(built):
    tmp, _, _ = built
    a = data.TokenBatches(tmp, "train", 8, 3, seed=7)
    stream = [next(a) for _ in range(6)]
    b = data.TokenBatches(tmp, "train", 8, 3, seed=7)
    for _ in range(2):
        next(b)
    state = json.loads(json.dumps(b.state_dict()))  # what a checkpoint stores
    c = data.TokenBatches(tmp, "train", 8, 3, seed=7)
    c.load_state_dict(state)
    for want in stream[2:]:
        got = next(c)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    other = next(data.TokenBatches(tmp, "train", 8, 3, seed=8))
    assert not torch.equal(other[0], stream[0][0])


def test_token_batches_ranks_partition_the_global_batch(built):
    tmp, _, _ = built
    whole = next(data.TokenBatches(tmp, "train", 8, 6, seed=3))[0]
    parts = [next(data.TokenBatches(tmp, "train", 8, 3, seed=3, rank=r, world_size=2))[0] for r in range(2)]
    assert torch.equal(torch.cat(parts), whole)


def test_token_batches_state_from_other_stream_refused(built):
    tmp, _, _ = built
    state = data.TokenBatches(tmp, "train", 8, 3, seed=7).state_dict()
    with pytest.raises(ValueError, match="different stream"):
        data.TokenBatches(tmp, "train", 8, 4, seed=7).load_state_dict(state)


@pytest.mark.parametrize("kwargs,match", [
    ({"seq_len": 0}, "seq_len"), ({"batch_size": -1}, "batch_size"), ({"rank": 2, "world_size": 2}, "rank"),
    ({"seq_len": 10**9}, "fewer than seq_len"), ({"seed": -1}, "seed")], ids=lambda v: str(v))
def test_token_batches_bad_arguments(built, kwargs, match):
    tmp, _, _ = built
    args = {"seq_len": 8, "batch_size": 2, "seed": 0, **kwargs}
    with pytest.raises(ValueError, match=match):
        data.TokenBatches(tmp, "train", **args)


def test_eval_batches_deterministic_disjoint_across_ranks(built):
    tmp, _, _ = built
    one = list(data.iter_eval_batches(tmp, seq_len=8, batch_size=4))
    assert one and all(x.shape == (4, 8) for x, _ in one)
    again = list(data.iter_eval_batches(tmp, seq_len=8, batch_size=4))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(one, again))
    val = torch.from_numpy(data.load_tokens(tmp, "val").astype(np.int64))
    assert torch.equal(one[0][0][1], val[8:16]) and torch.equal(one[0][1][1], val[9:17])
    ranks = [list(data.iter_eval_batches(tmp, 8, 2, rank=r, world_size=2)) for r in range(2)]
    assert len(ranks[0]) == len(ranks[1]) == len(one)
    assert torch.equal(torch.cat([ranks[0][0][0], ranks[1][0][0]]), one[0][0])
    assert len(list(data.iter_eval_batches(tmp, 8, 4, max_batches=1))) == 1
    with pytest.raises(ValueError, match="too small"):
        list(data.iter_eval_batches(tmp, 8, 10**7))


# --------------------------------------------------------------------------- carry bundle

def test_bundle_unpacks_byte_identical_and_detects_damage(built, tmp_path):
    tmp, _, _ = built
    data.write_json(tmp / "manifest.json", {"name": "fixture"})
    sizes = data.write_bundle(tmp, tmp_path / "bundle")
    assert set(sizes) == set(data.BUNDLE_FILES)
    data.rebuild_from_bundle(tmp_path / "bundle", tmp_path / "out")
    for name in ("train.bin", "val.bin", "tokenizer.json", "meta.json", "manifest.json"):
        assert (tmp / name).read_bytes() == (tmp_path / "out" / name).read_bytes(), name
    assert np.array_equal(data.load_tokens(tmp_path / "out", "val"), data.load_tokens(tmp, "val"))
    with lzma.open(tmp_path / "bundle" / "val.bin.xz", "wb") as f:
        f.write(b"\1\0" * 10)
    with pytest.raises(RuntimeError, match=r"\['val.bin'\] .* differ from the bundle"):
        data.rebuild_from_bundle(tmp_path / "bundle", tmp_path / "out2")
    (tmp_path / "bundle" / "val.bin.xz").unlink()
    with pytest.raises(FileNotFoundError, match="lacks"):
        data.rebuild_from_bundle(tmp_path / "bundle", tmp_path / "out3")


def test_corpus_config_rejects_unknown_source_and_bad_fraction():
    with pytest.raises(ValueError, match="unknown corpus sources"):
        corpus.CorpusConfig(sources=("nope",))
    with pytest.raises(ValueError, match="val_fraction"):
        corpus.CorpusConfig(sources=("shakespeare",), val_fraction=0.0)


def test_every_source_has_a_known_reader_origin_and_licence():
    for s in corpus.SOURCES.values():
        assert s.reader in corpus.READERS and s.origin in ("deb", "pypi") and s.licence and s.include


def test_gzip_members_are_read_transparently(tmp_path):
    page = tmp_path / "open.2.gz"
    page.write_bytes(gzip.compress(ROFF.encode()))
    assert corpus._convert_file(("man", str(page))) == markup.roff_to_text(ROFF)


# --------------------------------------------------------------------------- CLI settings

def _build_corpus_script():
    import importlib.util

    path = REPO / "experiments" / "build_corpus.py"
    spec = importlib.util.spec_from_file_location("build_corpus_script", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_settings_from_profile_and_flags(tmp_path):
    script = _build_corpus_script()
    cfg = tmp_path / "p.yaml"
    cfg.write_text("profile: smoke\ncorpus:\n  name: tiny\n  sources: [shakespeare]\n  vocab_size: 512\n")
    settings = script.resolve_settings(script.parse_args(["--config", str(cfg), "--out", "data/x",
                                                          "--val-fraction", "0.1"]))
    assert (settings["profile"], settings["name"], settings["sources"]) == ("smoke", "tiny", ["shakespeare"])
    assert (settings["vocab_size"], settings["val_fraction"]) == (512, 0.1)
    assert script.resolve_settings(script.parse_args(["--out", "data/full"]))["sources"] == ["all"]
    cfg.write_text("corpus:\n  name: tiny\n  vocab: 512\n")
    with pytest.raises(ValueError, match="unknown corpus keys"):
        script.resolve_settings(script.parse_args(["--config", str(cfg), "--out", "data/x"]))


def test_write_shards_without_documents_names_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="text/train.jsonl does not exist"):
        data.write_shards(tmp_path, 300)
