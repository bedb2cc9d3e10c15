//! `ferry ui`, the pure part: what the dashboard shows, computed from API objects (plan totals, throughput from
//! progress samples, ETA, checkpoint timelines, host slots), and the HTML for it. No I/O here: the command in
//! `ferry` watches the API, samples progress and serves these pages.

pub mod events;
pub mod format;
pub mod hosts;
pub mod html;
pub mod migrations;
pub mod plans;
pub mod route;
pub mod samples;
pub mod world;

pub use html::{Rendered, fragment, page};
pub use route::Route;
pub use samples::Samples;
pub use world::World;

/// The stylesheet and the live-update script, served by the binary itself (no CDN, no front-end build).
pub mod assets {
    pub const CSS: &str = include_str!("../assets/ui.css");
    pub const JS: &str = include_str!("../assets/live.js");
}
