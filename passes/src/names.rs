//! Node names joined from parts: the passes that grow a tiled step name
//! hundreds of thousands of nodes after the ones they derive from.

use std::sync::Arc;

/// `parts` joined by dots, built in one buffer kept per thread and then
/// shared: `partition` names 460k views and gathers of a tiled step, and
/// `format!` into a `String` copied again into the `Arc` was a tenth of it.
pub(crate) fn dotted(parts: &[&str]) -> Arc<str> {
    thread_local! {
        static SCRATCH: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
    }
    SCRATCH.with_borrow_mut(|name| {
        name.clear();
        for (i, part) in parts.iter().enumerate() {
            if i > 0 {
                name.push('.');
            }
            name.push_str(part);
        }
        Arc::from(name.as_str())
    })
}
