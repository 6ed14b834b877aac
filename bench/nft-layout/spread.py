#!/usr/bin/env python3
"""The padded layout's trade-off, computed (no kernel): capacity C (slots
drawn with `numgen random mod C`) against the spread and the rule
rewrites of endpoint-count walks.

  spread.py [K]     capacity policy: C = next power of two >= K*E (K
                    default 4, as gen.py's padded layout) when a Service
                    port's rule is written; the rule (and C) is rewritten
                    only when C < K*E/2 (the spread would pass 1/floor(K/2)
                    of a share) or C > 8*K*E (too many idle slots); between
                    rewrites the slots are shared out, each
                    endpoint holding floor(C/E) or ceil(C/E)

Prints, for E = 1..1000, the worst relative deviation of an endpoint's
share from 1/E at the capacity chosen for E, the worst over the counts
a Service reaches without a rewrite, the elements per Service port; then
the rewrites of some walks of E.
"""
import sys


def pow2_at_least(x):
    c = 1
    while c < x:
        c *= 2
    return c


def deviation(c, e):
    """Worst |share * E - 1| when C slots are shared out over E endpoints."""
    lo, hi = c // e, -(-c // e)
    return max(hi * e / c - 1, 1 - lo * e / c)


def walk(k, counts):
    """Rule rewrites along a walk of endpoint counts, the worst deviation met."""
    c = pow2_at_least(k * counts[0])
    rewrites, worst = 0, deviation(c, counts[0])
    for e in counts[1:]:
        if 2 * c < k * e or c > 8 * k * e:
            c = pow2_at_least(k * e)
            rewrites += 1
        worst = max(worst, deviation(c, e))
    return rewrites, worst, c


def main():
    k = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    print(f"# capacity policy K={k}: C = pow2 >= {k}E; rewrite when C < {k / 2:g}E or C > {8 * k}E")
    print(f"{'E':>5} {'C':>6} {'dev at C':>9} {'worst dev until rewrite':>24} {'elements/E':>10}")
    for e in [1, 2, 3, 4, 5, 7, 10, 20, 33, 49, 50, 51, 100, 300, 1000]:
        c = pow2_at_least(k * e)
        reach = [x for x in range(1, c + 1) if c <= 8 * k * x and 2 * c >= k * x]
        worst = max(deviation(c, x) for x in reach)
        print(f"{e:5d} {c:6d} {deviation(c, e):9.1%} {worst:24.1%} {c / e:10.1f}")
    print(f"worst deviation at the chosen C over E=1..1000: "
          f"{max(deviation(pow2_at_least(k * e), e) for e in range(1, 1001)):.1%}")
    walks = {
        "2 -> 1 -> 2 (readiness flip), x10": [2, 1] * 10 + [2],
        "2 -> 3 -> 2 (surge of one), x10": [2, 3] * 10 + [2],
        "3 -> 4 -> 3 (rolling update, surge 1), x10": [3, 4] * 10 + [3],
        "50 -> 49 -> 50, x10": [50, 49] * 10 + [50],
        "50 -> 51 -> 50, x10": [50, 51] * 10 + [50],
        "10: rolling update, maxSurge 25% (3), maxUnavailable 25% (2)":
            [10, 13, 11, 13, 11, 13, 11, 13, 11, 13, 10],
        "scale 2 -> 20 one at a time": list(range(2, 21)),
        "scale 20 -> 1 one at a time": list(range(20, 0, -1)),
    }
    for name, counts in walks.items():
        r, worst, _ = walk(k, counts)
        print(f"walk {name}: {len(counts) - 1} count changes, {r} rule rewrites, worst deviation {worst:.1%}")


if __name__ == "__main__":
    main()
