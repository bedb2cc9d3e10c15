//! The dashboard's pages and their paths. Kubernetes names and namespaces are DNS labels and subdomains, so
//! they go into paths as they are.

/// One page of the dashboard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    Plans,
    Plan { namespace: String, name: String },
    Migrations,
    Migration { namespace: String, name: String },
    Hosts,
    Events,
}

impl Route {
    /// The page at `path`; none for a path that names no page.
    pub fn parse(path: &str) -> Option<Route> {
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        let named = |namespace: &str, name: &str| {
            let ok = |s: &str| {
                let edges = |b: Option<&u8>| b.is_some_and(|b| b.is_ascii_alphanumeric());
                s.bytes().all(is_name_byte)
                    && edges(s.as_bytes().first())
                    && edges(s.as_bytes().last())
            };
            (ok(namespace) && ok(name)).then(|| (namespace.to_string(), name.to_string()))
        };
        match parts.as_slice() {
            [""] | ["plans"] => Some(Route::Plans),
            ["migrations"] => Some(Route::Migrations),
            ["hosts"] => Some(Route::Hosts),
            ["events"] => Some(Route::Events),
            ["plans", ns, name] => {
                named(ns, name).map(|(namespace, name)| Route::Plan { namespace, name })
            }
            ["migrations", ns, name] => {
                named(ns, name).map(|(namespace, name)| Route::Migration { namespace, name })
            }
            _ => None,
        }
    }

    pub fn path(&self) -> String {
        match self {
            Route::Plans => "/plans".into(),
            Route::Plan { namespace, name } => plan_path(namespace, name),
            Route::Migrations => "/migrations".into(),
            Route::Migration { namespace, name } => migration_path(namespace, name),
            Route::Hosts => "/hosts".into(),
            Route::Events => "/events".into(),
        }
    }

    /// Where the page's changing part streams from.
    pub fn live_path(&self) -> String {
        format!("/live{}", self.path())
    }

    /// The view in the navigation this page belongs to.
    pub fn section(&self) -> Route {
        match self {
            Route::Plan { .. } => Route::Plans,
            Route::Migration { .. } => Route::Migrations,
            other => other.clone(),
        }
    }
}

pub fn plan_path(namespace: &str, name: &str) -> String {
    format!("/plans/{namespace}/{name}")
}

pub fn migration_path(namespace: &str, name: &str) -> String {
    format!("/migrations/{namespace}/{name}")
}

/// What a Kubernetes name may hold (lower-case letters, digits, `-` and `.`; it starts and ends with a letter or
/// digit).
fn is_name_byte(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.'
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_page_parses_from_its_own_path() {
        let pages = [
            Route::Plans,
            Route::Plan {
                namespace: "apps".into(),
                name: "wave-1".into(),
            },
            Route::Migrations,
            Route::Migration {
                namespace: "apps".into(),
                name: "web.1".into(),
            },
            Route::Hosts,
            Route::Events,
        ];
        for page in pages {
            assert_eq!(Route::parse(&page.path()), Some(page.clone()));
        }
        assert_eq!(Route::parse("/"), Some(Route::Plans));
        assert_eq!(Route::parse("/plans/"), Some(Route::Plans));
    }

    #[test]
    fn a_path_that_names_nothing_is_no_page() {
        for path in [
            "/nope",
            "/plans/apps",
            "/migrations/apps/Web",
            "/migrations/apps/a%2Fb",
            "/migrations/../etc",
            "/plans/apps/x/y",
        ] {
            assert_eq!(Route::parse(path), None, "{path}");
        }
    }
}
