"""Side-by-side benchmarks: two things measured alternately in one process after warm-up, a ratio out.

The CLI's `explorer bench ...` group prints them; tests check their correctness, never their speed.

    overhead      a fully recording Session vs transformers' generate()
    inside        does looking inside a step (hooks, lens, attention, profile) leave anything behind?
    speculative   speculative decoding vs the target alone; prompt lookup vs plain decoding;
                  the draft/target cost ratio c that the speedup theory takes
"""
