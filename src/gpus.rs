//! The GPU profiles bundled into the binary, so `--gpu h100-80gb-sxm`
//! works wherever `zeroplan` is installed; `--gpu FILE.ron` reads others.

use std::path::Path;
use zeroplan_ir::spec::GpuProfile;

const BUNDLED: [(&str, &str); 5] = [
    ("v100-32gb", include_str!("../models/gpus/v100-32gb.ron")),
    ("a100-40gb", include_str!("../models/gpus/a100-40gb.ron")),
    ("a100-80gb", include_str!("../models/gpus/a100-80gb.ron")),
    ("h100-80gb-sxm", include_str!("../models/gpus/h100-80gb-sxm.ron")),
    ("h200", include_str!("../models/gpus/h200.ron")),
];

/// The profile `name` names: a bundled one (by file stem or profile name,
/// any case) or a RON file.
pub fn profile(name: &str) -> Result<GpuProfile, String> {
    let wanted = name.to_ascii_lowercase();
    for (stem, text) in BUNDLED {
        let file = format!("models/gpus/{stem}.ron");
        let profile = GpuProfile::from_ron(text, &file).map_err(|e| e.to_string())?;
        if wanted == stem || wanted == profile.name.to_ascii_lowercase() {
            return Ok(profile);
        }
    }
    let path = Path::new(name);
    if path.exists() {
        return GpuProfile::load(path).map_err(|e| e.to_string());
    }
    let names: Vec<&str> = BUNDLED.iter().map(|(stem, _)| *stem).collect();
    Err(format!(
        "error: --gpu {name}: no such profile; use one of {} or a RON file like models/gpus/h200.ron",
        names.join(", ")
    ))
}
