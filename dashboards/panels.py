"""Shared building blocks for the three dashboards.

Every dashboard takes its Prometheus data source from the ``datasource``
variable and filters by the ``job`` (service) and ``instance`` variables,
so one dashboard serves a single host or a fleet behind a Collector
gateway. Multi-value variables use ``.*`` for "All", so a query's label
matchers are always regexes (``tool=~"$tool"``).
"""

from __future__ import annotations

import json
import warnings
from urllib.parse import quote

# The classic (schema v1) dashboard model warns on import that a v2 schema
# exists; v1 is what Grafana provisions from files without feature flags.
# Import it here, once, and let the dashboard modules take it from here.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from grafana_foundation_sdk.builders import common as common_builders
    from grafana_foundation_sdk.builders import dashboard as dashboard_builders
    from grafana_foundation_sdk.builders import prometheus, stat, statetimeline, table, timeseries
    from grafana_foundation_sdk.models import common, dashboard as dashboard_model
    from grafana_foundation_sdk.models.prometheus import PromQueryFormat

PROMETHEUS = common.DataSourceRef(type_val="prometheus", uid="${datasource}")
RATE = "$__rate_interval"
RANGE = "$__range"
QUANTILES = (0.5, 0.95, 0.99)

# Colours of the shared threshold palettes.
GOOD, WARN, BAD = "green", "orange", "red"


def selector(*matchers: str) -> str:
    """A label selector with the job/instance filters and any extra matchers."""
    return "{" + ",".join(('job=~"$job"', 'instance=~"$instance"', *matchers)) + "}"


def quantile_expr(quantile: float, histogram: str, by: str, matchers: str) -> str:
    """``histogram_quantile`` over a toolkit histogram, grouped by ``by``."""
    return f"histogram_quantile({quantile}, sum by ({by}, le) (rate({histogram}_bucket{matchers}[{RATE}])))"


def query(expr: str, legend: str, ref_id: str, *, exemplar: bool = False, table_format: bool = False):
    """One PromQL target; table targets are instant queries."""
    target = prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref_id)
    if exemplar:
        target = target.exemplar(True)
    if table_format:
        target = target.instant().format(PromQueryFormat.TABLE)
    return target


def quantile_queries(histogram: str, by: str, matchers: str, legend: str, *, exemplar: bool = False) -> list:
    """p50/p95/p99 targets; the exemplar (trace link) rides on the p95 one."""
    return [
        query(
            quantile_expr(q, histogram, by, matchers),
            f"{legend} p{round(q * 100)}",
            ref_id,
            exemplar=exemplar and q == 0.95,
        )
        for q, ref_id in zip(QUANTILES, "ABC")
    ]


def thresholds(base: str, *steps: tuple[float, str]):
    """Absolute thresholds: ``base`` colour, then (value, colour) steps."""
    levels = [dashboard_model.Threshold(value=None, color=base)]
    levels += [dashboard_model.Threshold(value=value, color=color) for value, color in steps]
    return dashboard_builders.ThresholdsConfig().mode(dashboard_model.ThresholdsMode.ABSOLUTE).steps(levels)


def legend(*calcs: str):
    """A table legend on the right with the given reductions (mean, max...)."""
    return (
        common_builders.VizLegendOptions()
        .show_legend(True)
        .display_mode(common.LegendDisplayMode.TABLE if calcs else common.LegendDisplayMode.LIST)
        .placement(common.LegendPlacement.RIGHT if calcs else common.LegendPlacement.BOTTOM)
        .calcs(list(calcs))
    )


def timeseries_panel(
    title: str,
    description: str,
    unit: str,
    targets: list,
    *,
    stacked: bool = False,
    steps=None,
    threshold_style: common.GraphThresholdsStyleMode = common.GraphThresholdsStyleMode.OFF,
    min_value: float | None = None,
    max_value: float | None = None,
    width: int = 12,
    height: int = 8,
):
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(PROMETHEUS)
        .unit(unit)
        .targets(targets)
        .span(width)
        .height(height)
        .line_width(1)
        .fill_opacity(25 if stacked else 10)
        .legend(legend("mean", "max"))
        .tooltip(
            common_builders.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI).sort(common.SortOrder.DESCENDING)
        )
        .thresholds(steps or thresholds(GOOD))
        .thresholds_style(common_builders.GraphThresholdsStyleConfig().mode(threshold_style))
    )
    if stacked:
        panel = panel.stacking(common_builders.StackingConfig().mode(common.StackingMode.NORMAL))
    if min_value is not None:
        panel = panel.min(min_value)
    if max_value is not None:
        panel = panel.max(max_value)
    return panel


def stat_panel(title: str, description: str, unit: str, target, steps, *, width: int = 6, height: int = 4):
    return (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(PROMETHEUS)
        .unit(unit)
        .with_target(target)
        .thresholds(steps)
        .color_mode(common.BigValueColorMode.BACKGROUND)
        .graph_mode(common.BigValueGraphMode.AREA)
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .span(width)
        .height(height)
    )


def per_series_stat(title: str, description: str, unit: str, target, steps, *, width: int = 12, height: int = 6):
    """A stat panel with one coloured tile per series (per tool, per executor)."""
    return (
        stat_panel(title, description, unit, target, steps, width=width, height=height)
        .graph_mode(common.BigValueGraphMode.NONE)
        .text_mode(common.BigValueTextMode.VALUE_AND_NAME)
    )


def state_timeline_panel(
    title: str,
    description: str,
    target,
    steps,
    mappings: dict[str, tuple[str, str]] | None = None,
    *,
    width: int = 24,
    height: int = 5,
):
    """States over time, coloured by ``steps``; ``mappings`` names exact values (value -> (text, colour))."""
    panel = (
        statetimeline.Panel()
        .title(title)
        .description(description)
        .datasource(PROMETHEUS)
        .with_target(target)
        .thresholds(steps)
        .color_scheme(dashboard_builders.FieldColor().mode(dashboard_model.FieldColorModeId.THRESHOLDS))
        .show_value(common.VisibilityMode.NEVER)
        .merge_values(True)
        .line_width(0)
        .fill_opacity(80)
        .legend(legend())
        .span(width)
        .height(height)
    )
    if mappings:
        value_map = dashboard_model.ValueMap(
            options={
                value: dashboard_model.ValueMappingResult(text=text, color=color, index=index)
                for index, (value, (text, color)) in enumerate(mappings.items())
            }
        )
        panel = panel.mappings([value_map])
    return panel


def table_panel(
    title: str,
    description: str,
    targets: list,
    columns: dict[str, str],
    sort_by: str,
    units: dict[str, str],
    steps,
    *,
    width: int = 24,
    height: int = 8,
):
    """An instant table joining ``targets`` on their labels.

    ``columns`` renames the merged fields (``Value #A`` ...) to readable
    headers; ``units`` sets a unit per (renamed) column. The ``sort_by``
    column is coloured by ``steps``.
    """
    transformations = [
        dashboard_model.DataTransformerConfig(id_val="merge", options={}),
        dashboard_model.DataTransformerConfig(
            id_val="organize",
            options={"excludeByName": {"Time": True}, "renameByName": columns},
        ),
    ]
    panel = (
        table.Panel()
        .title(title)
        .description(description)
        .datasource(PROMETHEUS)
        .targets(targets)
        .transformations(transformations)
        .sort_by([common_builders.TableSortByFieldState().display_name(sort_by).desc(True)])
        .thresholds(steps)
        .span(width)
        .height(height)
        .override_by_name(
            sort_by,
            [
                dashboard_model.DynamicConfigValue(
                    id_val="custom.cellOptions", value={"type": "color-background", "mode": "gradient"}
                ),
            ],
        )
    )
    for column, unit in units.items():
        panel = panel.override_by_name(column, [dashboard_model.DynamicConfigValue(id_val="unit", value=unit)])
    return panel


def datasource_variables(with_traces: bool = False) -> list:
    variables = [
        dashboard_builders.DatasourceVariable("datasource").label("Prometheus").type("prometheus"),
    ]
    if with_traces:
        variables.append(dashboard_builders.DatasourceVariable("traces").label("Jaeger").type("jaeger"))
    return variables


def label_variable(name: str, label: str, metric: str, matchers: str = ""):
    """A multi-select label filter; "All" means the regex ``.*``."""
    return (
        dashboard_builders.QueryVariable(name)
        .label(label)
        .datasource(PROMETHEUS)
        .query(f"label_values({metric}{matchers}, {name})")
        .definition(f"label_values({metric}{matchers}, {name})")
        .refresh(dashboard_model.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dashboard_model.VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .current(dashboard_model.VariableOption(selected=True, text=["All"], value=["$__all"]))
    )


def target_variables(metric: str) -> list:
    """``job`` (the service) and ``instance`` (the host:port scraped)."""
    return [
        label_variable("job", "Service (job)", metric),
        label_variable("instance", "Instance", metric, '{job=~"$job"}'),
    ]


def jaeger_search_link():
    """A dashboard link opening Jaeger's tool spans in Grafana Explore."""
    left = {"datasource": "${traces}", "queries": [{"refId": "A", "queryType": "search"}]}
    return (
        dashboard_builders.DashboardLink("Tool traces in Jaeger")
        .type(dashboard_model.DashboardLinkType.LINK)
        .icon("external link")
        .tooltip("Search the tool spans (execute_tool ...) in Jaeger")
        .url("/explore?left=" + quote(json.dumps(left, separators=(",", ":")), safe="${}_"))
        .target_blank(True)
    )


def new_dashboard(title: str, uid: str, description: str, tags: list[str], variables: list, panels: list):
    """A dashboard with the project's defaults, its template variables and its panels, in order."""
    dashboard = (
        dashboard_builders.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["agent-otel", *tags])
        .time("now-1h", "now")
        .refresh("30s")
        .timezone("browser")
        .tooltip(dashboard_model.DashboardCursorSync.CROSSHAIR)
        .readonly()
    )
    for variable in variables:
        dashboard = dashboard.with_variable(variable)
    for panel in panels:
        dashboard = dashboard.with_panel(panel)
    return dashboard
