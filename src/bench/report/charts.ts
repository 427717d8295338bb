/**
 * Charts for `kvgate report`, rendered to SVG strings on the server with echarts' SSR renderer
 * (no DOM, no canvas, no animation). The SVG is meant to be inlined into HTML: the xmlns
 * declarations are dropped (the HTML parser puts <svg> in the SVG namespace itself), so the page
 * holds no URL at all. echarts escapes the text it draws (legend entries, axis names).
 */

import type { EChartsOption } from "echarts";
import * as echarts from "echarts";

export const CHART_WIDTH = 580;
export const CHART_HEIGHT = 340;

export interface LineSeries {
  name: string;
  color: string;
  /** [x, y] points; drawn in the order given. */
  points: Array<[number, number]>;
}

export interface LineChartSpec {
  /** Used as the SVG's accessible name. */
  title: string;
  xName: string;
  yName: string;
  series: LineSeries[];
  /** Format y-axis labels as percentages of 1 (0.5 → 50%). */
  yPercent?: boolean;
  yMin?: number;
  yMax?: number;
  /** Step-free straight segments with visible point markers (the default) or a smooth line. */
  smooth?: boolean;
}

export interface BarSeries {
  name: string;
  color: string;
  values: Array<number | null>;
}

export interface BarChartSpec {
  title: string;
  categories: string[];
  xName?: string;
  yName: string;
  series: BarSeries[];
  /** Colour each bar by its category (one series, one bar per run) and hide the legend. */
  colorByCategory?: string[];
  yMax?: number;
  /** Print each bar's value on it, formatted so. */
  valueLabel?: (v: number) => string;
  /**
   * Use a log y axis when the largest positive value is at least this many times the smallest,
   * so a small bar beside a tall one stays visible (the axis name then says "log scale").
   */
  logWhenSpread?: number;
}

/** Whether values spread by at least `factor` (largest / smallest positive). */
export function spreadAtLeast(values: ReadonlyArray<number | null>, factor: number): boolean {
  const pos = values.filter((v): v is number => v !== null && v > 0);
  return pos.length >= 2 && Math.max(...pos) >= factor * Math.min(...pos);
}

/** echarts measures text (legend layout) with sans-serif metrics; render with the same family. */
const TEXT = { fontFamily: "sans-serif" };

const compact = (v: number): string => {
  const a = Math.abs(v);
  if (a >= 1e6) return `${+(v / 1e6).toFixed(1)}M`;
  if (a >= 1e4) return `${+(v / 1e3).toFixed(0)}k`;
  return `${+v.toFixed(3)}`;
};
const percent = (v: number): string => `${+(v * 100).toFixed(1)}%`;

function base(names: string[]): EChartsOption {
  return {
    animation: false,
    backgroundColor: "#ffffff",
    textStyle: TEXT,
    legend: {
      show: names.length > 0,
      data: names,
      bottom: 4,
      left: "center",
      itemWidth: 18,
      itemGap: 18,
      itemHeight: 10,
      textStyle: { fontSize: 12 },
    },
    grid: { left: 16, right: 28, top: 40, bottom: names.length ? 54 : 30, containLabel: true },
  };
}

function valueAxis(name: string, extra: Record<string, unknown> = {}) {
  return {
    type: "value" as const,
    name,
    nameTextStyle: { fontSize: 12, color: "#444", align: "left" as const },
    axisLabel: { fontSize: 11, formatter: compact },
    splitLine: { lineStyle: { color: "#e8e8ec" } },
    ...extra,
  };
}

function render(option: EChartsOption, title: string, width: number, height: number): string {
  const chart = echarts.init(null, null, { renderer: "svg", ssr: true, width, height });
  try {
    chart.setOption(option);
    return inlineSvg(chart.renderToSVGString(), title);
  } finally {
    chart.dispose();
  }
}

const attr = (s: string) =>
  s.replace(/&/g, "&amp;").replace(/"/g, "&quot;").replace(/</g, "&lt;").replace(/>/g, "&gt;");

/** Drops xmlns declarations and adds an accessible name. */
export function inlineSvg(svg: string, title: string): string {
  return svg
    .replace(/\s+xmlns(:[a-z]+)?="[^"]*"/g, "")
    .replace(/^<svg\b/, `<svg role="img" aria-label="${attr(title)}"`);
}

export function lineChart(spec: LineChartSpec, width = CHART_WIDTH, height = CHART_HEIGHT): string {
  const yExtra: Record<string, unknown> = { min: spec.yMin, max: spec.yMax };
  if (spec.yPercent) yExtra["axisLabel"] = { fontSize: 11, formatter: percent };
  const option: EChartsOption = {
    ...base(spec.series.map((s) => s.name)),
    xAxis: { ...valueAxis(spec.xName), nameLocation: "middle", nameGap: 26, scale: false },
    yAxis: { ...valueAxis(spec.yName, yExtra), nameLocation: "end", nameGap: 14 },
    series: spec.series.map((s) => ({
      type: "line",
      name: s.name,
      data: s.points,
      color: s.color,
      smooth: spec.smooth ?? false,
      showSymbol: true,
      symbol: "circle",
      symbolSize: s.points.length > 12 ? 4 : 7,
      lineStyle: { width: 2 },
    })),
  };
  return render(option, spec.title, width, height);
}

export function barChart(spec: BarChartSpec, width = CHART_WIDTH, height = CHART_HEIGHT): string {
  const byCat = spec.colorByCategory;
  const log =
    spec.logWhenSpread !== undefined &&
    spreadAtLeast(
      spec.series.flatMap((s) => s.values),
      spec.logWhenSpread,
    );
  const fmt = spec.valueLabel;
  const yAxis = log
    ? {
        ...valueAxis(`${spec.yName}, log scale`, { type: "log", logBase: 10 }),
        nameLocation: "end" as const,
        nameGap: 14,
      }
    : { ...valueAxis(spec.yName, { min: 0, max: spec.yMax }), nameLocation: "end" as const, nameGap: 14 };
  const option: EChartsOption = {
    ...base(byCat ? [] : spec.series.map((s) => s.name)),
    xAxis: {
      type: "category",
      data: spec.categories,
      name: spec.xName,
      nameLocation: "middle",
      nameGap: 26,
      axisLabel: { fontSize: 11, interval: 0, overflow: "truncate", width: 110 },
    },
    yAxis: yAxis as EChartsOption["yAxis"],
    series: spec.series.map((s) => ({
      type: "bar",
      name: s.name,
      color: s.color,
      barMaxWidth: 48,
      ...(fmt
        ? {
            label: {
              show: true,
              position: "top",
              fontSize: 11,
              color: "#222",
              formatter: (p: { value: unknown }) => (typeof p.value === "number" ? fmt(p.value) : ""),
            },
          }
        : {}),
      data: s.values.map((v, i) =>
        byCat ? { value: v ?? "-", itemStyle: { color: byCat[i % byCat.length] } } : (v ?? "-"),
      ),
    })),
  };
  return render(option, spec.title, width, height);
}
