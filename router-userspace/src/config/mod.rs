pub mod model;
pub use model::*;
