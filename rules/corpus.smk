# Corpus and tokenizer: real English text from what the package registries ship, cleaned,
# deduplicated, split, tokenized with a BPE trained on the training split (data/<corpus>/).

CORPUS_DIR = f"data/{config['corpus']['name']}"
CORPUS_FILES = ("train.bin", "val.bin", "meta.json", "tokenizer.json", "manifest.json")


rule corpus:
    input:
        script=stage_input("experiments/build_corpus.py"),
    output:
        [f"{CORPUS_DIR}/{name}" for name in CORPUS_FILES],
    params:
        corpus=config["corpus"],
    log:
        log_path("corpus"),
    shell:
        script_cmd("{input.script}", f"--out {CORPUS_DIR}")
