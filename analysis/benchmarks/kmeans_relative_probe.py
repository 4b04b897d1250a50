"""k-means (K = 4, 6) of base-model features of the y-region relative to x (mean_y - mean_x, last and
all layers; first three y states - mean_x; per-token base surprisal of the first 8 y tokens) on 600
validation rows against the true strategy (issue 15: can a clustering start the hard phase?).
Usage: OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 .venv/bin/python analysis/benchmarks/kmeans_relative_probe.py"""
import numpy as np, torch
from sklearn.cluster import KMeans
from sklearn.metrics import normalized_mutual_info_score as nmi
from zfree.data.batching import collate, encode_pair, pad_id_of
from zfree.data.pairs import load_pairs
from zfree.models.base import load_base
torch.set_num_threads(1); torch.manual_seed(0)
pairs = load_pairs("data/synth/default/val.jsonl")[:600]
labels = np.array([p.strategy for p in pairs])
bb, tok = load_base("data/base/default/model"); bb.eval()
enc = [encode_pair(tok, p) for p in pairs]
F = {k: [] for k in ("ymean-xmean", "ymean-xmean_alllayers", "surprisal_profile", "first3y-xmean")}
with torch.no_grad():
    for i in range(0, len(enc), 100):
        b = collate(enc[i:i+100], pad_id=pad_id_of(tok))
        o = bb(input_ids=b.input_ids, attention_mask=b.attention_mask, output_hidden_states=True)
        hs = o.hidden_states
        T = b.input_ids.shape[1]; pos = torch.arange(T)[None]
        xm = ((pos >= 1) & (pos < (b.prefix_len - 1)[:, None])).float()
        ym = b.target_mask.float()
        def pool(h, m): return (h * m[..., None]).sum(1) / m.sum(1, keepdim=True)
        F["ymean-xmean"].append(pool(hs[-1], ym) - pool(hs[-1], xm))
        F["ymean-xmean_alllayers"].append(torch.cat([pool(h, ym) - pool(h, xm) for h in hs[1:]], -1))
        lp = torch.log_softmax(o.logits[:, :-1], -1).gather(2, b.input_ids[:, 1:, None])[..., 0]
        prof = torch.zeros(len(b.prefix_len), 8)
        for r in range(len(b.prefix_len)):
            s = int(b.prefix_len[r]) - 1
            v = -lp[r, s:s + 8]; prof[r, :len(v)] = v
        F["surprisal_profile"].append(prof)
        first = torch.stack([hs[-1][r, int(b.prefix_len[r]):int(b.prefix_len[r]) + 3].mean(0) for r in range(len(b.prefix_len))])
        F["first3y-xmean"].append(first - pool(hs[-1], xm))
for k, v in F.items():
    X = torch.cat(v).numpy(); X = (X - X.mean(0)) / (X.std(0) + 1e-6)
    for K in (4, 6):
        print(k, K, round(nmi(labels, KMeans(K, n_init=5, random_state=0).fit(X).labels_), 3), flush=True)
