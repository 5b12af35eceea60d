//! Charts drawn server-side by plotters as SVG, inlined into the pages.
//!
//! Every text a chart shows (series names, lane labels) may come from telemetry: plotters'
//! SVG backend escapes text and attribute values, and labels are cut to [`MAX_LABEL_CHARS`]
//! so that a hostile or careless name cannot push the chart out of shape. Times are Unix
//! nanoseconds; the x axis is seconds from the range's start, labelled as UTC clock times.

use lagscope_model::UnixNanos;
use plotters::coord::Shift;
use plotters::prelude::*;

/// The longest label a chart prints (longer ones end in `…`).
pub const MAX_LABEL_CHARS: usize = 40;

const WIDTH: u32 = 1100;
const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];
/// The red of a broken guarantee, the amber of a warning, the grey of a neutral bar.
pub const RED: RGBColor = RGBColor(204, 35, 35);
pub const AMBER: RGBColor = RGBColor(230, 150, 0);
pub const GREY: RGBColor = RGBColor(150, 160, 170);
pub const GREEN: RGBColor = RGBColor(60, 160, 80);

/// A label as a chart prints it: at most [`MAX_LABEL_CHARS`] characters, control
/// characters replaced. A longer one keeps its start and its end with `…` between: names
/// are built as `cluster / namespace / node / role`, and the end tells rows of one cluster
/// apart.
pub fn label(text: &str) -> String {
    label_within(text, MAX_LABEL_CHARS)
}

/// The longest name a line chart's legend prints (a legend entry has 330 px).
const MAX_LEGEND_CHARS: usize = 52;

/// The longest name a lane of a Gantt chart or swimlane prints: lanes are named
/// `cluster / url / probe` or `cluster / namespace / node`, and clusters of several
/// deployments (or the demo's rounds) differ in the middle of long names.
const MAX_LANE_CHARS: usize = 64;

/// The width of a lane chart's label area for its longest printed name: ~6.3 px a character
/// at 11 px, between 80 px and 420 px (64 characters), the rest of the 1 100 px for the bars.
fn lane_label_area(lane_names: &[String]) -> u32 {
    let longest = lane_names.iter().map(|name| name.chars().count().min(MAX_LANE_CHARS)).max().unwrap_or(0);
    ((longest as f64 * 6.3) as u32 + 16).clamp(80, 420)
}

/// [`label`] with room for `max` characters.
fn label_within(text: &str, max: usize) -> String {
    let chars: Vec<char> = text.chars().map(|c| if c.is_control() { '\u{fffd}' } else { c }).collect();
    if chars.len() <= max {
        return chars.into_iter().collect();
    }
    let head = (max - 1) / 3;
    let tail = max - 1 - head;
    chars[..head].iter().chain(std::iter::once(&'…')).chain(&chars[chars.len() - tail..]).collect()
}

/// The colour of the `index`th series.
pub fn color(index: usize) -> RGBColor {
    PALETTE[index % PALETTE.len()]
}

/// A time range as the charts' x axis: seconds from `from`.
#[derive(Debug, Clone, Copy)]
pub struct Span {
    pub from: UnixNanos,
    pub to: UnixNanos,
}

impl Span {
    fn seconds(self, at: UnixNanos) -> f64 {
        (at.saturating_sub(self.from)) as f64 / 1e9
    }
    fn width(self) -> f64 {
        self.seconds(self.to).max(1e-3)
    }
    fn clock(self, seconds: f64) -> String {
        let at = self.from.saturating_add((seconds * 1e9) as i64);
        clock(at, self.width())
    }
}

/// `HH:MM:SS` (with milliseconds when the range is under a minute), UTC.
pub fn clock(at: UnixNanos, range_seconds: f64) -> String {
    let seconds = at.div_euclid(1_000_000_000);
    let millis = at.rem_euclid(1_000_000_000) / 1_000_000;
    let of_day = seconds.rem_euclid(86_400);
    let (hour, minute, second) = (of_day / 3600, of_day % 3600 / 60, of_day % 60);
    if range_seconds < 60.0 {
        format!("{hour:02}:{minute:02}:{second:02}.{millis:03}")
    } else {
        format!("{hour:02}:{minute:02}:{second:02}")
    }
}

/// The unit of state ids: their axis prints every digit (nearby states differ in the last).
pub const STATE_UNIT: &str = "state id";

/// One line of a line chart: (time, value) points in time order.
#[derive(Debug, Clone)]
pub struct Line {
    pub name: String,
    pub points: Vec<(UnixNanos, f64)>,
}

fn render(height: u32, draw: impl FnOnce(&DrawingArea<SVGBackend<'_>, Shift>) -> Result<(), String>) -> String {
    let mut svg = String::new();
    let outcome = {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        let drawn = root.fill(&WHITE).map_err(|error| error.to_string()).and_then(|()| draw(&root));
        drawn.and_then(|()| root.present().map_err(|error| error.to_string()))
    };
    match outcome {
        Ok(()) => responsive(svg),
        Err(error) => format!("<p class=\"chart-error\">chart could not be drawn: {}</p>", escape(&error)),
    }
}

/// Lets the SVG scale to its container (plotters writes a fixed width and height).
fn responsive(svg: String) -> String {
    svg.replacen("<svg ", "<svg class=\"chart\" preserveAspectRatio=\"xMinYMin meet\" ", 1)
}

/// Minimal HTML escaping for the few strings this module writes outside plotters.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            other => out.push(other),
        }
    }
    out
}

/// A line chart of several series over `span`, with a legend.
pub fn line_chart(lines: &[Line], span: Span, unit: &str) -> String {
    let values = lines.iter().flat_map(|line| line.points.iter().map(|(_, value)| *value));
    let (low, high) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(low, high), v| (low.min(v), high.max(v)));
    if !low.is_finite() {
        return "<p class=\"empty\">no samples in this range</p>".to_string();
    }
    // A flat line (all values equal, e.g. a counter's rate of 0) still gets a readable axis.
    let pad = if high - low < 1e-9 { (high.abs() * 0.1).max(1.0) } else { ((high - low) * 0.05).max(1e-9) };
    let legend_rows = lines.len().min(12) as u32;
    render(300 + 18 * legend_rows.div_ceil(3), |root| {
        let (plot, legend) = root.split_vertically(300);
        let mut chart = ChartBuilder::on(&plot)
            .margin(8)
            .x_label_area_size(28)
            .y_label_area_size(80)
            .build_cartesian_2d(0f64..span.width(), (low - pad)..(high + pad))
            .map_err(|error| error.to_string())?;
        chart
            .configure_mesh()
            .x_labels(8)
            .y_labels(6)
            .x_label_formatter(&|seconds| span.clock(*seconds))
            .y_label_formatter(&|value| if unit == STATE_UNIT { format!("{value:.0}") } else { format_value(*value) })
            .y_desc(label(unit))
            .light_line_style(RGBColor(235, 235, 235))
            .draw()
            .map_err(|error| error.to_string())?;
        for (index, line) in lines.iter().enumerate() {
            let points: Vec<(f64, f64)> = line.points.iter().map(|(at, value)| (span.seconds(*at), *value)).collect();
            chart
                .draw_series(LineSeries::new(points, color(index).stroke_width(2)))
                .map_err(|error| error.to_string())?;
        }
        for (index, line) in lines.iter().take(12).enumerate() {
            let x = 90 + (index % 3) as i32 * 330;
            let y = 4 + (index / 3) as i32 * 18;
            legend
                .draw(&Rectangle::new([(x, y + 3), (x + 14, y + 13)], color(index).filled()))
                .map_err(|error| error.to_string())?;
            legend
                .draw(&Text::new(
                    label_within(&line.name, MAX_LEGEND_CHARS),
                    (x + 20, y + 2),
                    ("sans-serif", 13).into_font(),
                ))
                .map_err(|error| error.to_string())?;
        }
        Ok(())
    })
}

/// Large numbers in a few characters: 12.3k, 4.5M, 1.2G.
pub fn format_value(value: f64) -> String {
    let magnitude = value.abs();
    if magnitude >= 1e9 {
        format!("{:.1}G", value / 1e9)
    } else if magnitude >= 1e6 {
        format!("{:.1}M", value / 1e6)
    } else if magnitude >= 1e4 {
        format!("{:.1}k", value / 1e3)
    } else if magnitude >= 100.0 || value.fract() == 0.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.2}")
    }
}

/// A bar on a lane (a Gantt row or a swimlane).
#[derive(Debug, Clone)]
pub struct Bar {
    pub lane: usize,
    pub start: UnixNanos,
    pub end: UnixNanos,
    pub color: RGBColor,
    /// Drawn with a thick outline (the attempt that broke a guarantee).
    pub highlight: bool,
    /// A short text drawn at the bar's start, if there is room.
    pub text: Option<String>,
}

/// Lanes of bars over `span`: a Gantt chart of windows, or a client's swimlanes.
pub fn lanes(lane_names: &[String], bars: &[Bar], span: Span) -> String {
    if lane_names.is_empty() {
        return "<p class=\"empty\">nothing in this range</p>".to_string();
    }
    let rows = lane_names.len();
    let height = 60 + 34 * rows as u32;
    render(height, |root| {
        let mut chart = ChartBuilder::on(root)
            .margin(8)
            .x_label_area_size(28)
            .y_label_area_size(lane_label_area(lane_names))
            .build_cartesian_2d(0f64..span.width(), 0f64..rows as f64)
            .map_err(|error| error.to_string())?;
        chart
            .configure_mesh()
            // A fixed size: plotters' default scales with the chart's height, which here
            // grows with the lanes (one lane's labels came out under 5 px).
            .label_style(("sans-serif", 11))
            .x_labels(8)
            .y_labels(rows.min(60) * 2 + 1)
            .x_label_formatter(&|seconds| span.clock(*seconds))
            .y_label_formatter(&|y| {
                // Lane i spans [rows-i-1, rows-i); its name sits at the middle.
                let middle = y - y.floor();
                if (middle - 0.5).abs() > 0.01 {
                    return String::new();
                }
                let index = rows as i64 - 1 - y.floor() as i64;
                usize::try_from(index)
                    .ok()
                    .and_then(|index| lane_names.get(index))
                    .map(|name| label_within(name, MAX_LANE_CHARS))
                    .unwrap_or_default()
            })
            .disable_y_mesh()
            .light_line_style(RGBColor(235, 235, 235))
            .draw()
            .map_err(|error| error.to_string())?;
        let width = span.width();
        for bar in bars {
            if bar.lane >= rows {
                continue;
            }
            let top = (rows - bar.lane) as f64 - 0.15;
            let bottom = (rows - bar.lane - 1) as f64 + 0.15;
            let start = span.seconds(bar.start).clamp(0.0, width);
            // Every bar at least a pixel or so wide, so that instant events show.
            let end = span.seconds(bar.end).clamp(0.0, width).max(start + width / 900.0);
            chart
                .draw_series(std::iter::once(Rectangle::new([(start, top), (end, bottom)], bar.color.filled())))
                .map_err(|error| error.to_string())?;
            if bar.highlight {
                chart
                    .draw_series(std::iter::once(Rectangle::new(
                        [(start, top + 0.1), (end, bottom - 0.1)],
                        BLACK.stroke_width(3),
                    )))
                    .map_err(|error| error.to_string())?;
            }
            if let Some(text) = &bar.text {
                chart
                    .draw_series(std::iter::once(Text::new(
                        label(text),
                        (start, top + 0.12),
                        ("sans-serif", 11).into_font().color(&BLACK),
                    )))
                    .map_err(|error| error.to_string())?;
            }
        }
        Ok(())
    })
}

/// A heatmap: one row per name, one cell per time bucket, coloured by value in `[0, 1]`
/// (green to amber to red); `None` cells (no sample) are left white.
pub fn heatmap(rows: &[(String, Vec<Option<f64>>)], span: Span) -> String {
    if rows.is_empty() {
        return "<p class=\"empty\">no samples in this range</p>".to_string();
    }
    let names: Vec<String> = rows.iter().map(|(name, _)| name.clone()).collect();
    let mut bars = Vec::new();
    for (lane, (_, cells)) in rows.iter().enumerate() {
        let buckets = cells.len().max(1) as i64;
        let step = (span.to - span.from) / buckets;
        for (index, cell) in cells.iter().enumerate() {
            let Some(value) = cell else { continue };
            let start = span.from + step * index as i64;
            bars.push(Bar { lane, start, end: start + step, color: heat(*value), highlight: false, text: None });
        }
    }
    lanes(&names, &bars, span)
}

/// Green (0) through amber (0.8) to red (1 and above).
pub fn heat(value: f64) -> RGBColor {
    if value >= 1.0 {
        RED
    } else if value >= 0.8 {
        AMBER
    } else {
        let t = (value / 0.8).clamp(0.0, 1.0);
        let mix = |a: u8, b: u8| (f64::from(a) + (f64::from(b) - f64::from(a)) * t) as u8;
        RGBColor(mix(200, 250), mix(235, 220), mix(200, 120))
    }
}

/// `#rrggbb` of a colour, for HTML legends next to a chart.
pub fn hex(color: RGBColor) -> String {
    format!("#{:02x}{:02x}{:02x}", color.0, color.1, color.2)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPAN: Span = Span { from: 1_000_000_000_000, to: 1_060_000_000_000 };

    #[test]
    fn telemetry_in_labels_is_escaped_and_cut() {
        let hostile = format!("<script>alert(1)</script>\"'&{}", "x".repeat(500));
        let lines = vec![Line { name: hostile.clone(), points: vec![(SPAN.from, 1.0), (SPAN.to, 2.0)] }];
        let svg = line_chart(&lines, SPAN, "states");
        assert!(svg.starts_with("<svg class=\"chart\""), "{svg}");
        assert!(!svg.contains("<script>"), "{svg}");
        assert!(svg.contains("&lt;script&gt;"), "{svg}");
        assert!(!svg.contains(&"x".repeat(100)), "label not cut");
        let bars = vec![Bar {
            lane: 0,
            start: SPAN.from,
            end: SPAN.to,
            color: RED,
            highlight: true,
            text: Some(hostile.clone()),
        }];
        let svg = lanes(std::slice::from_ref(&hostile), &bars, SPAN);
        assert!(!svg.contains("<script>") && svg.contains("&lt;script&gt;"), "{svg}");
    }

    #[test]
    fn a_flat_line_gets_a_readable_axis() {
        let lines = vec![Line { name: "zero".to_string(), points: vec![(SPAN.from, 0.0), (SPAN.to, 0.0)] }];
        let svg = line_chart(&lines, SPAN, "answers/s");
        // plotters writes each label's text on a line of its own.
        assert!(svg.contains("\n0.50\n") && svg.contains("\n1\n"), "{svg}");
        assert!(!svg.contains("-0.00"), "{svg}");
    }

    #[test]
    fn a_legend_names_clusters_whole() {
        // Two federations' router-1: the names differ in the middle, which a cut would lose.
        let names =
            ["hdfs-no-namenodes-fixed.hdfs-prod / router-1 / ns60", "hdfs-no-namenodes.hdfs-prod / router-1 / ns60"];
        let lines: Vec<Line> = names
            .iter()
            .map(|name| Line { name: name.to_string(), points: vec![(SPAN.from, 1.0), (SPAN.to, 2.0)] })
            .collect();
        let svg = line_chart(&lines, SPAN, "answers/s");
        for name in names {
            assert!(svg.contains(name), "{name} whole in the legend");
        }
        let long = Line { name: "x".repeat(100), points: vec![(SPAN.from, 1.0)] };
        assert!(!line_chart(&[long], SPAN, "").contains(&"x".repeat(60)), "a legend entry is still cut");
    }

    #[test]
    fn one_lane_is_as_readable_as_many() {
        let bar = |lane| Bar { lane, start: SPAN.from, end: SPAN.to, color: RED, highlight: false, text: None };
        let one = lanes(&["router-1".to_string()], &[bar(0)], SPAN);
        let names: Vec<String> = (0..8).map(|index| format!("router-{index}")).collect();
        let many = lanes(&names, &(0..8).map(bar).collect::<Vec<_>>(), SPAN);
        let sizes = |svg: &str| -> Vec<f64> {
            svg.split("font-size=\"").skip(1).filter_map(|rest| rest.split('"').next()?.parse().ok()).collect()
        };
        let (one, many) = (sizes(&one), sizes(&many));
        assert!(!one.is_empty() && one.iter().all(|size| *size >= 8.0), "{one:?}");
        assert_eq!(one[0], many[0], "the same labels' size with one lane as with eight");
    }

    #[test]
    fn lanes_print_long_names_that_differ_in_the_middle_apart() {
        // Two of the demo's probe lanes: the same cluster name but for the scenario between.
        let names = vec![
            "round-1.pulsar-tcp-probe-half-dead.pulsar-east / pulsar-east / tcp".to_string(),
            "round-1.pulsar-switch-back-delay-lost.pulsar-east / pulsar-east / tcp".to_string(),
        ];
        // Cut to 40 characters, as lanes were, the two read the same.
        assert_eq!(label(&names[0]), label(&names[1]));
        let svg = lanes(&names, &[], SPAN);
        let printed: Vec<String> = names.iter().map(|name| label_within(name, MAX_LANE_CHARS)).collect();
        assert!(printed[0].contains("half-dead") && printed[1].contains("delay-lost"), "{printed:?}");
        for printed in &printed {
            assert!(
                svg.contains(&printed.replace('/', "&#x2f;")) || svg.contains(printed),
                "{printed} not in the chart"
            );
        }
        // Short names leave the bars more room; the widest area still leaves them most of it.
        assert_eq!(lane_label_area(&["client-1".to_string()]), 80);
        assert!(lane_label_area(&names) > 400);
        let widest = lane_label_area(&["x".repeat(500)]);
        assert_eq!(widest, lane_label_area(&["x".repeat(MAX_LANE_CHARS)]), "longer names are cut, not given more room");
        assert!(widest <= 420, "{widest}");
    }

    #[test]
    fn charts_without_data_say_so() {
        assert!(line_chart(&[], SPAN, "").contains("no samples"));
        assert!(lanes(&[], &[], SPAN).contains("nothing"));
        assert!(heatmap(&[], SPAN).contains("no samples"));
    }

    #[test]
    fn heat_goes_from_green_to_red() {
        assert_eq!(heat(1.2), RED);
        assert_eq!(heat(0.9), AMBER);
        assert_eq!(heat(0.0), RGBColor(200, 235, 200));
        assert_eq!(label(&"é".repeat(50)).chars().count(), MAX_LABEL_CHARS);
        // The end of a long name is what tells its rows apart: it stays.
        let long = label("es-node-level-pressure.es-prod / es-node-1 / logs/0 / primary");
        assert_eq!(long, "es-node-level…-node-1 / logs/0 / primary");
        assert_eq!(long.chars().count(), MAX_LABEL_CHARS);
        assert_eq!(format_value(12_345.0), "12.3k");
        assert_eq!(clock(0, 3600.0), "00:00:00");
    }
}
