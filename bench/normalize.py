"""What text normalisation costs per chunk, against the first-audio budget: ms per chunk (p50,
p99; wall time and the call's CPU time, which other work on the machine does not inflate) for
each profile's languages, a chunk with nothing to normalise beside one full of
numbers, and a 200-character chunk. The grammars are loaded (compiled once, then cached)
before timing.

    python bench/normalize.py [--repeat 50]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
from _common import report, setup

from livekit.plugins.veena.normalization import grammars
from livekit.plugins.veena.normalization.normalizer import TextNormalizer, hindi_cardinal

CHUNKS = {
    ("veena", ("hi", "en"), "en-IN"): {
        "plain": "Thank you for calling, how may I help you today with your order?",
        "numbers": "Your order of ₹1,50,000 ships on 15/08/2026 at 3:30 PM.",
        "hindi": "आपका ऑर्डर ₹2,500 का है और 15/08/2026 को 3:30 बजे पहुँचेगा।",
        "issue #53": "₹12,35,000 was paid on 05/09/2026.",
        "200 chars": ("Your refund of Rs. 12,500 for order 4417 was approved on 03/11/2026; "
                      "it reaches your account in 5 to 7 days, and the remaining ₹2.5 lakh "
                      "follows by 20/11/2026 at 10:30 AM. Call 1800 22 3344."),
    },
    ("orpheus", ("en",), "en-US"): {
        "plain": "Thanks for waiting, I found your booking and everything looks fine.",
        "numbers": "Your total is $1,925.21, due on 12/08/2026 at 3:30 PM.",
    },
    ("spark", ("zh", "en"), "zh-CN"): {
        "plain": "您好，很高兴为您服务，请问有什么可以帮您？",
        "numbers": "您的订单共计35.5元，将于2026年12月6日送达。",
        "phone": "我的电话是13812345678，共¥1,234.5元。",
    },
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=50)
    args = ap.parse_args()
    setup()
    rows = []
    for (profile, languages, locale), chunks in CHUNKS.items():
        n = TextNormalizer(languages, locale)
        if grammars.available():
            grammars.prepare(languages)
        for kind, text in chunks.items():
            n.normalize(text)  # warm
            times, cpu = [], []
            for _ in range(args.repeat):
                hindi_cardinal.cache_clear()  # each number read afresh: no chunk is free
                t, c = time.perf_counter(), time.thread_time()
                n.normalize(text)
                cpu.append((time.thread_time() - c) * 1000)
                times.append((time.perf_counter() - t) * 1000)
            rows.append({"profile": profile, "chunk": kind, "chars": len(text),
                         "skips_grammar": not n.needs(text),
                         "ms_p50": float(np.percentile(times, 50)),
                         "ms_p99": float(np.percentile(times, 99)),
                         # CPU time of the call: what the chunk costs, whatever else runs
                         "cpu_ms_p50": float(np.percentile(cpu, 50)),
                         "cpu_ms_p99": float(np.percentile(cpu, 99))})
    report("normalize", rows, {"grammars": "nemo-text-processing" if grammars.available()
                               else "not installed: the project's own rules only",
                               "repeat": args.repeat,
                               # other work on the machine slows the grammars: say how much
                               "load_average_1min": round(os.getloadavg()[0], 2)})


if __name__ == "__main__":
    main()
