"""Forward calls a user makes on a converted model that the parity tests do not: inputs that broadcast as the native
model's do."""

import pytest
import torch
from tiny_native import ATOL, VOCAB, bert

from hf_scratch_transformer.conversion import from_hf


def test_one_row_of_token_types_serves_the_whole_batch():
    """BERT adds its token-type embeddings by broadcasting, so one row (or a 1D one) serves every sequence, as
    `position_ids` of one row do; ours refused it: "`token_type_ids` must have shape (2, 7) ..., got (1, 7)"."""
    torch.manual_seed(0)
    native = bert()
    ours = from_hf(native)
    ids = torch.randint(3, VOCAB, (2, 7), generator=torch.Generator().manual_seed(1))
    types = torch.tensor([0, 0, 0, 1, 1, 1, 1])
    with torch.no_grad():
        expected = native(input_ids=ids, token_type_ids=types.expand(2, -1)).logits
        for given in (types[None], types):
            torch.testing.assert_close(ours(input_ids=ids, token_type_ids=given).logits, expected, atol=ATOL, rtol=0)
            torch.testing.assert_close(native(input_ids=ids, token_type_ids=given).logits, expected, atol=ATOL, rtol=0)
    refused = torch.zeros(3, 7, dtype=torch.long)  # neither the batch's rows nor one row: still named
    with pytest.raises(ValueError, match=r"`token_type_ids` must have shape \(2, 7\)"):
        ours(input_ids=ids, token_type_ids=refused)
