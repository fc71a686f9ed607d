#!/usr/bin/env python3
"""Writes a TypeScript file that type-checks a Grafana dashboard JSON against
@grafana/schema: the whole dashboard as a `Dashboard`, and each panel again
with its plugin's own options and field config (timeseries, stat) and its
queries as Prometheus queries. Usage: dashboard_ts.py DASHBOARD.json OUT.ts
Compile OUT.ts with `tsc --noEmit --strict` where @grafana/schema is installed.
"""
import json
import sys

HEADER = """\
import type * as schema from '@grafana/schema';
import type * as timeseries from '@grafana/schema/dist/esm/raw/composable/timeseries/panelcfg/x/TimeSeriesPanelCfg_types.gen';
import type * as stat from '@grafana/schema/dist/esm/raw/composable/stat/panelcfg/x/StatPanelCfg_types.gen';

// A JSON file holds an enum member as its value ("list", not
// LegendDisplayMode.List): map each enum type to the union of its values.
type Json<T> = T extends string ? `${T}`
  : T extends number ? number
  : T extends boolean ? boolean
  : T extends null | undefined ? T
  : T extends readonly (infer U)[] ? Json<U>[]
  : T extends object ? { [K in keyof T]: Json<T[K]> }
  : T;

// What Grafana's Prometheus data source reads from a target.
type PromQuery = schema.DataQuery & {
  expr: string;
  legendFormat?: string;
  range?: boolean;
  instant?: boolean;
  interval?: string;
};
// schema.Panel types only the field config's `custom` by the plugin; its
// options are a plain record there.
type PanelOf<Type extends string, Options, Custom> = Omit<schema.Panel<Options, Custom>, 'targets' | 'type' | 'options'> & {
  type: Type;
  targets: PromQuery[];
  options: Options;
};
type TimeSeriesPanel = PanelOf<'timeseries', timeseries.Options, timeseries.FieldConfig>;
type StatPanel = PanelOf<'stat', stat.Options, {}>;
type Row = Omit<schema.RowPanel, 'panels'> & { type: 'row'; panels: schema.Panel[] };
"""

PANEL_TYPES = {"timeseries": "TimeSeriesPanel", "stat": "StatPanel", "row": "Row"}


def main() -> int:
    dashboard_path, out_path = sys.argv[1], sys.argv[2]
    with open(dashboard_path, encoding="utf-8") as f:
        dashboard = json.load(f)
    lines = [HEADER, f"export const dashboard: Json<schema.Dashboard> = {json.dumps(dashboard, indent=2)};", ""]
    for i, panel in enumerate(dashboard.get("panels", [])):
        kind = PANEL_TYPES.get(panel.get("type"))
        if kind is None:
            print(f"panel {panel.get('title')!r}: type {panel.get('type')!r} has no checked type here; "
                  f"use one of {sorted(PANEL_TYPES)} or add it to {sys.argv[0]}", file=sys.stderr)
            return 1
        lines.append(f"// {panel.get('title')}")
        lines.append(f"export const panel{i}: Json<{kind}> = {json.dumps(panel, indent=2)};")
        lines.append("")
    with open(out_path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
