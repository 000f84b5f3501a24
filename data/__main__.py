"""`python -m hf_scratch_transformer.data`: the installed default corpus (Tiny Shakespeare), e.g.

    hf-scratch tokenizer --kind bpe --family decoder --files "$(python -m hf_scratch_transformer.data)" \
        --output-dir outputs/tokenizer
"""

from hf_scratch_transformer.data import DEFAULT_CORPUS

print(DEFAULT_CORPUS)
