//! Dashboards as data: TOML files (one dashboard each, `dashboards/*.toml`) naming their panels,
//! each panel's query and chart kind, and the layout. The built-in ones are compiled in; a
//! directory given at start-up adds dashboards and replaces built-ins of the same name, so a
//! user changes what they see without recompiling. A file that does not parse, or names an
//! unknown source, chart or anomaly kind, stops the start-up with its path, line and field.

use std::collections::BTreeMap;
use std::path::Path;

use lagscope_model::AnomalyKind;
use serde::Deserialize;

/// The dashboards shipped with lagscope (the files of the repository's `dashboards/`).
const BUILT_IN: &[(&str, &str)] = &[
    ("lag", include_str!("../../../dashboards/lag.toml")),
    ("routers", include_str!("../../../dashboards/routers.toml")),
    ("shards", include_str!("../../../dashboards/shards.toml")),
    ("failover", include_str!("../../../dashboards/failover.toml")),
];

/// The most panels one dashboard may have (each is a query per page view).
pub const MAX_PANELS: usize = 24;

/// One dashboard: a page of panels.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Dashboard {
    /// Its URL name (`/dashboards/{slug}`): the file's stem.
    #[serde(skip)]
    pub slug: String,
    pub title: String,
    #[serde(default)]
    pub description: String,
    /// Position in the navigation bar (lowest first, then by title).
    #[serde(default)]
    pub order: i32,
    #[serde(default, rename = "panel")]
    pub panels: Vec<Panel>,
}

/// One panel: what to read and how to draw it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Panel {
    pub title: String,
    #[serde(default)]
    pub description: String,
    pub chart: ChartKind,
    #[serde(default)]
    pub width: Width,
    pub query: Query,
}

/// How a panel draws its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChartKind {
    /// Lines over time (series).
    Line,
    /// Rows of coloured cells over time (series).
    Heatmap,
    /// Windows as bars on lanes, a Gantt chart (anomalies).
    Lanes,
    /// A table.
    Table,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Width {
    #[default]
    Full,
    Half,
}

/// What a panel reads.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "source", rename_all = "snake_case", deny_unknown_fields)]
pub enum Query {
    /// The series of one metric whose labels match, one line (or heatmap row) per value of
    /// the `group_by` labels.
    Series {
        metric: String,
        #[serde(default, rename = "match")]
        matchers: BTreeMap<String, String>,
        #[serde(default)]
        group_by: Vec<String>,
        /// Per-second rate of a counter instead of its value.
        #[serde(default)]
        rate: bool,
        /// Divide each value by the latest value of this metric's series with the same
        /// cluster, namespace and node (a heatmap of pressure against its limit).
        #[serde(default)]
        ratio_to: Option<String>,
        /// Heatmap colours: `pressure` (0 green, 0.8 amber, 1 red) or `up_down` (1 green,
        /// 0 red).
        #[serde(default)]
        colors: HeatColors,
        #[serde(default)]
        unit: String,
    },
    /// Anomalies of these kinds in the range, on lanes by `group_by` or listed.
    Anomalies {
        kinds: Vec<String>,
        #[serde(default)]
        group_by: AnomalyLane,
    },
    /// Per follower/observer: latest applied and committed state, lag, Burrow-style status.
    FollowerStatus {},
    /// Per node, over time: how many states its applied state is behind its namespace's
    /// committed state (the nodes furthest behind first).
    BehindCommitted {},
    /// Staleness of reads per namespace and serving node: p50/p99/max in states and seconds.
    Staleness {},
    /// Per router: the role its cache holds for each node, against the role the node reports.
    RoleComparison {},
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HeatColors {
    #[default]
    Pressure,
    UpDown,
}

/// What one lane of an anomalies panel is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AnomalyLane {
    /// cluster / namespace / node
    #[default]
    Node,
    /// cluster / namespace
    Namespace,
    Client,
    Kind,
}

impl Query {
    fn source(&self) -> &'static str {
        match self {
            Query::Series { .. } => "series",
            Query::Anomalies { .. } => "anomalies",
            Query::FollowerStatus {} => "follower_status",
            Query::BehindCommitted {} => "behind_committed",
            Query::Staleness {} => "staleness",
            Query::RoleComparison {} => "role_comparison",
        }
    }

    fn charts(&self) -> &'static [ChartKind] {
        match self {
            Query::Series { .. } => &[ChartKind::Line, ChartKind::Heatmap, ChartKind::Table],
            Query::Anomalies { .. } => &[ChartKind::Lanes, ChartKind::Table],
            Query::BehindCommitted {} => &[ChartKind::Line],
            _ => &[ChartKind::Table],
        }
    }
}

/// The dashboards a service shows, by slug, in navigation order.
#[derive(Debug, Clone, Default)]
pub struct Dashboards {
    pub list: Vec<Dashboard>,
}

impl Dashboards {
    /// The built-in dashboards, plus (replacing those of the same name) every `*.toml` in
    /// `directory` when given.
    pub fn load(directory: Option<&Path>) -> Result<Self, String> {
        let mut by_slug: BTreeMap<String, Dashboard> = BTreeMap::new();
        for (slug, text) in BUILT_IN {
            by_slug.insert(slug.to_string(), parse(slug, text, &format!("built-in dashboard {slug}"))?);
        }
        if let Some(directory) = directory {
            let entries = std::fs::read_dir(directory)
                .map_err(|error| format!("cannot read the dashboards directory {}: {error}", directory.display()))?;
            let mut paths: Vec<_> = entries
                .filter_map(Result::ok)
                .map(|entry| entry.path())
                .filter(|path| path.extension().is_some_and(|ext| ext == "toml"))
                .collect();
            paths.sort();
            for path in paths {
                let slug = path.file_stem().and_then(|stem| stem.to_str()).unwrap_or_default().to_string();
                if slug.is_empty() || !slug.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
                    return Err(format!(
                        "{}: a dashboard's file name is its URL: use letters, digits, - and _ only",
                        path.display()
                    ));
                }
                let text = std::fs::read_to_string(&path).map_err(|error| format!("{}: {error}", path.display()))?;
                by_slug.insert(slug.clone(), parse(&slug, &text, &path.display().to_string())?);
            }
        }
        let mut list: Vec<Dashboard> = by_slug.into_values().collect();
        list.sort_by(|a, b| a.order.cmp(&b.order).then_with(|| a.title.cmp(&b.title)));
        Ok(Self { list })
    }

    pub fn get(&self, slug: &str) -> Option<&Dashboard> {
        self.list.iter().find(|dashboard| dashboard.slug == slug)
    }
}

/// Parses and checks one dashboard; errors name `origin`, the line and what is wrong.
pub fn parse(slug: &str, text: &str, origin: &str) -> Result<Dashboard, String> {
    let mut dashboard: Dashboard = toml::from_str(text).map_err(|error| {
        let line = error
            .span()
            .map(|span| format!(" line {}", text[..span.start.min(text.len())].lines().count().max(1)))
            .unwrap_or_default();
        format!("{origin}:{line}: {}", error.message())
    })?;
    dashboard.slug = slug.to_string();
    if dashboard.panels.is_empty() {
        return Err(format!("{origin}: a dashboard needs at least one [[panel]]"));
    }
    if dashboard.panels.len() > MAX_PANELS {
        return Err(format!("{origin}: {} panels (at most {MAX_PANELS})", dashboard.panels.len()));
    }
    for (index, panel) in dashboard.panels.iter().enumerate() {
        let at = format!("{origin}: panel {} ({:?})", index + 1, panel.title);
        if !panel.query.charts().contains(&panel.chart) {
            return Err(format!(
                "{at}: chart {:?} cannot show source {:?} (it can: {:?})",
                panel.chart,
                panel.query.source(),
                panel.query.charts()
            ));
        }
        match &panel.query {
            Query::Anomalies { kinds, .. } => {
                if kinds.is_empty() {
                    return Err(format!("{at}: query.kinds is empty"));
                }
                for kind in kinds {
                    if AnomalyKind::parse(kind).is_none() {
                        return Err(format!("{at}: query.kinds: unknown anomaly kind {kind:?}"));
                    }
                }
            }
            Query::Series { metric, .. } if metric.trim().is_empty() => {
                return Err(format!("{at}: query.metric is empty"));
            }
            _ => {}
        }
    }
    Ok(dashboard)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_built_in_dashboards_load() {
        let dashboards = Dashboards::load(None).expect("built-ins parse");
        let slugs: Vec<&str> = dashboards.list.iter().map(|d| d.slug.as_str()).collect();
        for slug in ["lag", "routers", "shards", "failover"] {
            assert!(slugs.contains(&slug), "{slugs:?}");
        }
    }

    #[test]
    fn a_directory_adds_and_replaces_dashboards() {
        let directory = tempfile::tempdir().expect("temp dir");
        let mine = "title = \"Mine\"\norder = -1\n[[panel]]\ntitle = \"Applied\"\nchart = \"line\"\n\
                    [panel.query]\nsource = \"series\"\nmetric = \"lagscope.server.applied_state\"\n";
        std::fs::write(directory.path().join("mine.toml"), mine).expect("write");
        std::fs::write(directory.path().join("lag.toml"), mine.replace("Mine", "My lag")).expect("write");
        let dashboards = Dashboards::load(Some(directory.path())).expect("loads");
        assert_eq!(dashboards.list[0].slug, "mine", "order = -1 comes first");
        assert_eq!(dashboards.get("lag").map(|d| d.title.as_str()), Some("My lag"));
        assert!(dashboards.get("shards").is_some());
    }

    #[test]
    fn errors_name_the_file_line_and_field() {
        let error =
            parse("x", "title = \"X\"\n[[panel]]\ntitle = \"p\"\nchart = \"pie\"\n", "x.toml").expect_err("pie");
        assert!(error.starts_with("x.toml: line 4") && error.contains("pie"), "{error}");
        let unknown_kind = "title = \"X\"\n[[panel]]\ntitle = \"p\"\nchart = \"table\"\n\
                            [panel.query]\nsource = \"anomalies\"\nkinds = [\"stale_reads\"]\n";
        let error = parse("x", unknown_kind, "x.toml").expect_err("kind");
        assert!(error.contains("unknown anomaly kind \"stale_reads\""), "{error}");
        let mismatched = "title = \"X\"\n[[panel]]\ntitle = \"p\"\nchart = \"line\"\n\
                          [panel.query]\nsource = \"anomalies\"\nkinds = [\"stale_read\"]\n";
        let error = parse("x", mismatched, "x.toml").expect_err("chart");
        assert!(error.contains("cannot show source \"anomalies\""), "{error}");
        let typo = "title = \"X\"\n[[panel]]\ntitle = \"p\"\nchart = \"line\"\n\
                    [panel.query]\nsource = \"series\"\nmetric = \"m\"\ngroup = [\"a\"]\n";
        let error = parse("x", typo, "x.toml").expect_err("unknown field");
        assert!(error.contains("group"), "{error}");
        assert!(parse("x", "title = \"X\"\n", "x.toml").expect_err("empty").contains("at least one"));
    }
}
