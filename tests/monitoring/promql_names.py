#!/usr/bin/env python3
"""Metric names in PromQL expressions, checked against a scrape.

  promql_names.py exprs DASHBOARD.json ALERTS.yml     one expression a line, variables filled in
  promql_names.py check SCRAPE.txt DASHBOARD.json ALERTS.yml
      every metric a dashboard panel or an alert names is in the scrape

Not a full PromQL parser: it drops strings, label matchers, grouping
clauses, ranges and variables, then takes the identifiers that are not
functions or keywords. Enough for the expressions we write, and strict: an
unknown identifier counts as a metric name and fails the check.
"""
import json
import re
import sys

FUNCTIONS = {
    "abs", "absent", "absent_over_time", "avg", "avg_over_time", "bottomk", "ceil", "changes", "clamp",
    "clamp_max", "clamp_min", "count", "count_over_time", "count_values", "day_of_month", "day_of_week",
    "delta", "deriv", "exp", "floor", "group", "histogram_quantile", "holt_winters", "hour", "idelta",
    "increase", "irate", "label_join", "label_replace", "last_over_time", "ln", "log10", "log2", "max",
    "max_over_time", "min", "min_over_time", "minute", "month", "predict_linear", "quantile",
    "quantile_over_time", "rate", "resets", "round", "scalar", "sgn", "sort", "sort_desc", "sqrt",
    "stddev", "stddev_over_time", "stdvar", "sum", "sum_over_time", "time", "timestamp", "topk", "vector",
    "year", "present_over_time",
}
KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool",
            "offset", "inf", "nan"}


def dashboard_exprs(path):
    with open(path, encoding="utf-8") as f:
        dashboard = json.load(f)
    out = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                if t.get("expr"):
                    out.append((f"panel {p.get('title')!r}", t["expr"]))
            walk(p.get("panels", []))

    walk(dashboard.get("panels", []))
    for v in dashboard.get("templating", {}).get("list", []):
        q = v.get("query")
        if isinstance(q, dict):
            q = q.get("query")
        m = re.fullmatch(r"\s*label_values\((.*),\s*\w+\)\s*", q or "")
        if m:
            out.append((f"variable {v['name']!r}", m.group(1)))
    return out


def alert_exprs(path):
    import yaml  # python3-yaml

    with open(path, encoding="utf-8") as f:
        rules = yaml.safe_load(f)
    return [(f"alert {r.get('alert') or r.get('record')}", r["expr"])
            for g in rules["groups"] for r in g["rules"]]


def fill(expr):
    """The expression as Prometheus would run it: variables filled in."""
    expr = expr.replace("$__rate_interval", "15s").replace("$__interval", "5s")
    return re.sub(r"\$\{?(\w+)\}?", ".*", expr)


def names(expr):
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", "", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1", e)
    e = re.sub(r"\[[^\]]*\]", "", e)
    e = re.sub(r"\$\{?\w+\}?", "", e)
    e = re.sub(r"\b\d+(\.\d+)?(e[+-]?\d+)?\b", "", e)
    found = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        word = m.group(0)
        if word.lower() in KEYWORDS:
            continue
        rest = e[m.end():].lstrip()
        if word in FUNCTIONS and re.match(r"(\(|by\b|without\b)", rest):
            continue
        found.add(word)
    return found


def scrape_names(path):
    out = set()
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                out.add(re.match(r"[A-Za-z_:][A-Za-z0-9_:]*", line).group(0))
    return out


def main(argv):
    if argv[1] == "exprs":
        for _, e in dashboard_exprs(argv[2]) + alert_exprs(argv[3]):
            print(" ".join(fill(e).split()))
        return 0
    if argv[1] == "check":
        have = scrape_names(argv[2])
        bad = 0
        checked = 0
        for where, e in dashboard_exprs(argv[3]) + alert_exprs(argv[4]):
            used = names(e)
            if not used:
                print(f"{where}: names no metric: {e}", file=sys.stderr)
                bad += 1
            for n in sorted(used - have):
                print(f"{where}: {n} is not in the scrape ({e})", file=sys.stderr)
                bad += 1
            checked += 1
        print(f"{checked} expressions, {bad} problem(s)")
        return 1 if bad else 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
