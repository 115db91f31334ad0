#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Generation with num_return_sequences, gathered through deval as token ids and as text.

    torchrun --nproc-per-node 3 examples/generate.py    (needs torch, transformers)
    torchrun --nproc-per-node 1 examples/generate.py    (the same in one process)

A tiny GPT-2 made from a config (untrained, nothing is downloaded) continues 8 prompts of
different lengths with beam search, 2 continuations each, over a character tokenizer of its
own. Each batch of generated ids has a width of its own (its longest prompt, left-padded,
and up to 15 new tokens): deval pads the ids across ranks, puts them and the decoded strings
in dataset order, drops the sampler's padding, and rank 0 prints:

    16 sequences for 8 prompts, the token ids decode to the texts: True
    'the cat' -> 'the cattmmllffzzqqeekk' | 'the catmmttffhhuuww  w'
    'a dog ran' -> 'a dog rannllfftthhqqkkee' | 'a dog rannllfftthhqqkkey'
    ...
    'so it goes' -> 'so it goesllfftthhfqqzzuu' | 'so it goesllfftthhqqkkeyy'

The same lines come out of one process.
"""

import sys

import deval

try:
    import torch
    from torch.utils.data import DataLoader, DistributedSampler
    from transformers import GPT2Config, GPT2LMHeadModel
except ImportError:
    print("generate.py needs torch and transformers, which are not installed")
    sys.exit(0)

PAD, EOS = 0, 1
CHARS = " abcdefghijklmnopqrstuvwxyz"          # token 2 + i is CHARS[i]
PROMPTS = ["the cat", "a dog ran", "to be", "it was the best", "hello", "once upon a time",
           "we", "so it goes"]


def encode(text):
    return [2 + CHARS.index(c) for c in text]


def decode(ids):
    return "".join(CHARS[i - 2] for i in ids if i >= 2)


def collate(prompts):
    """Left-padded token ids and their attention mask, as a tokenizer for generation makes."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), PAD)
    mask = torch.zeros((len(prompts), width), dtype=torch.int64)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(encode(p))
        mask[i, width - len(p):] = 1
    return ids, mask


def main():
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=2 + len(CHARS), n_positions=64, n_embd=32,
                                       n_layer=2, n_head=2, bos_token_id=EOS,
                                       eos_token_id=EOS, pad_token_id=PAD)).eval()
    k = 2
    with deval.join() as g:                       # the group from the launcher
        sampler = DistributedSampler(PROMPTS, g.world_size, g.rank, shuffle=False)
        loader = DataLoader(PROMPTS, batch_size=2, sampler=sampler, collate_fn=collate)
        ids, texts = [], []
        for prompt, mask in g.eval_loop(loader):
            with torch.no_grad():
                out = model.generate(prompt, attention_mask=mask, max_new_tokens=15,
                                     num_beams=3, num_return_sequences=k, no_repeat_ngram_size=2)
            # [batch * k, width]: k rows per prompt, the width this batch's beams reached
            ids.append(g.gather_for_metrics(out, pad_index=PAD))
            texts += g.gather_for_metrics([decode(row) for row in out.tolist()])
    if g.rank == 0:
        print("%d sequences for %d prompts, the token ids decode to the texts: %s" % (
            len(texts), len(PROMPTS), [decode(row) for t in ids for row in t.tolist()] == texts))
        for i, p in enumerate(PROMPTS):
            print("%r -> %s" % (p, " | ".join(repr(t) for t in texts[k * i:k * (i + 1)])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
