//! Writing a chart to a file: `.svg` as drawn, `.png` rasterised in-process
//! by `resvg` (no external `rsvg-convert`), so every command that draws can
//! write either. One entry point, [`write_image`], and [`check_image_path`]
//! to reject a bad name before a long run rather than after it.

use resvg::{tiny_skia, usvg};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// Pixels per SVG unit in a PNG: twice the SVG's size, sharp on HiDPI
/// screens and in documents.
pub const PNG_SCALE: f32 = 2.0;

/// Why a chart could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The file name ends in neither `.svg` nor `.png`.
    #[error("{}: name a .svg or .png file", .0.display())]
    Extension(PathBuf),
    /// Writing the file failed.
    #[error("cannot write {}: {error} (does the directory exist and is it writable?)", .path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        error: std::io::Error,
    },
    /// The SVG did not parse (a bug in the chart code: please report it).
    #[error("the chart is not valid SVG ({0}); write .svg to see it, and report this")]
    Svg(String),
    /// The picture is empty or too large to rasterise.
    #[error("cannot rasterise a {width}×{height} chart to PNG; write .svg instead")]
    Size {
        /// Width in SVG units.
        width: f32,
        /// Height in SVG units.
        height: f32,
    },
    /// PNG encoding failed.
    #[error("cannot encode PNG: {0}")]
    Encode(String),
}

/// The kinds of file a chart can be written as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImageFormat {
    /// The SVG text as drawn.
    Svg,
    /// Rasterised by resvg at [`PNG_SCALE`].
    Png,
}

/// The format a path asks for, by its extension (case-insensitive).
pub fn check_image_path(path: &Path) -> Result<ImageFormat, ImageError> {
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    match ext.to_ascii_lowercase().as_str() {
        "svg" => Ok(ImageFormat::Svg),
        "png" => Ok(ImageFormat::Png),
        _ => Err(ImageError::Extension(path.to_path_buf())),
    }
}

/// Writes `svg` to `path`: as is for `.svg`, rasterised for `.png`.
pub fn write_image(path: &Path, svg: &str) -> Result<(), ImageError> {
    let bytes = match check_image_path(path)? {
        ImageFormat::Svg => svg.as_bytes().to_vec(),
        ImageFormat::Png => {
            // Seen on a GPU machine without fonts: a PNG of lines and no
            // words. Say so rather than hand over a picture that cannot be read.
            if !fonts_available() {
                eprintln!(
                    "warning: {}: no font found, the PNG has no text (the .svg has; install a font such as fonts-dejavu-core)",
                    path.display()
                );
            }
            svg_to_png(svg)?
        }
    };
    std::fs::write(path, bytes).map_err(|error| ImageError::Write {
        path: path.to_path_buf(),
        error,
    })
}

/// The SVG rasterised to PNG bytes on a white background, at [`PNG_SCALE`].
pub fn svg_to_png(svg: &str) -> Result<Vec<u8>, ImageError> {
    let opt = usvg::Options {
        fontdb: fonts(),
        ..usvg::Options::default()
    };
    let tree = usvg::Tree::from_str(svg, &opt).map_err(|e| ImageError::Svg(e.to_string()))?;
    let size = tree.size();
    let too_big = |v: f32| !(1.0..=20_000.0).contains(&v);
    if too_big(size.width()) || too_big(size.height()) {
        return Err(ImageError::Size {
            width: size.width(),
            height: size.height(),
        });
    }
    let px = |v: f32| (v * PNG_SCALE).ceil() as u32;
    let mut pixmap =
        tiny_skia::Pixmap::new(px(size.width()), px(size.height())).ok_or(ImageError::Size {
            width: size.width(),
            height: size.height(),
        })?;
    // Charts without a background of their own would be transparent, which
    // reads as black in some viewers.
    pixmap.fill(tiny_skia::Color::WHITE);
    let scale = tiny_skia::Transform::from_scale(PNG_SCALE, PNG_SCALE);
    resvg::render(&tree, scale, &mut pixmap.as_mut());
    pixmap
        .encode_png()
        .map_err(|e| ImageError::Encode(e.to_string()))
}

/// The system's fonts, loaded once. The SVG names only the generic families
/// (`sans-serif`, `monospace`); fontdb maps those to Arial, Times New Roman
/// and Courier New, which a Linux box rarely has, and text would vanish: map
/// them to the first of the usual free fonts that is installed (any font at
/// all as a last resort).
fn fonts() -> Arc<usvg::fontdb::Database> {
    static DB: OnceLock<Arc<usvg::fontdb::Database>> = OnceLock::new();
    DB.get_or_init(|| {
        let mut db = usvg::fontdb::Database::new();
        db.load_system_fonts();
        let families: Vec<String> = db
            .faces()
            .flat_map(|f| f.families.iter().map(|(name, _)| name.clone()))
            .collect();
        let pick = |preferred: &[&str]| {
            preferred
                .iter()
                .find(|p| families.iter().any(|f| f == *p))
                .map(|p| p.to_string())
                .or_else(|| families.first().cloned())
        };
        let sans = pick(&[
            "DejaVu Sans",
            "Liberation Sans",
            "Noto Sans",
            "Arial",
            "Helvetica",
        ]);
        let mono = pick(&[
            "DejaVu Sans Mono",
            "Liberation Mono",
            "Noto Sans Mono",
            "Courier New",
        ]);
        if let Some(s) = sans {
            db.set_sans_serif_family(s.clone());
            db.set_serif_family(s);
        }
        if let Some(m) = mono {
            db.set_monospace_family(m);
        }
        Arc::new(db)
    })
    .clone()
}

/// Whether any font was found: without one a PNG has no text (the SVG still
/// does). For a warning and for tests.
pub fn fonts_available() -> bool {
    !fonts().is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SVG: &str = r##"<svg xmlns="http://www.w3.org/2000/svg" width="40" height="20"><rect x="0" y="0" width="20" height="20" fill="#ff0000"/></svg>"##;

    #[test]
    fn a_png_is_the_svg_rasterised_at_twice_its_size() {
        let png = svg_to_png(SVG).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        let pixmap = tiny_skia::Pixmap::decode_png(&png).unwrap();
        assert_eq!((pixmap.width(), pixmap.height()), (80, 40));
        let at = |x: u32, y: u32| pixmap.pixel(x, y).unwrap();
        assert_eq!(
            (at(5, 5).red(), at(5, 5).green()),
            (255, 0),
            "the red square"
        );
        assert_eq!(
            (at(70, 5).red(), at(70, 5).green()),
            (255, 255),
            "white background"
        );
    }

    #[test]
    fn text_in_the_generic_sans_serif_family_is_drawn() {
        if !fonts_available() {
            eprintln!("no system fonts: nothing to check");
            return;
        }
        let svg = r##"<svg xmlns="http://www.w3.org/2000/svg" width="200" height="40"><text x="5" y="30" font-family="sans-serif" font-size="24" fill="#000">MMMM</text></svg>"##;
        let pixmap = tiny_skia::Pixmap::decode_png(&svg_to_png(svg).unwrap()).unwrap();
        let dark = pixmap.pixels().iter().filter(|p| p.red() < 128).count();
        assert!(
            dark > 100,
            "only {dark} dark pixels: the text was not drawn"
        );
    }

    #[test]
    fn the_extension_picks_the_format_and_anything_else_is_refused() {
        assert_eq!(
            check_image_path(Path::new("a.SVG")).unwrap(),
            ImageFormat::Svg
        );
        assert_eq!(
            check_image_path(Path::new("d/a.png")).unwrap(),
            ImageFormat::Png
        );
        let e = check_image_path(Path::new("a.jpg")).unwrap_err();
        assert_eq!(e.to_string(), "a.jpg: name a .svg or .png file");
    }

    #[test]
    fn write_image_writes_either_format() {
        let dir = std::env::temp_dir().join(format!("memprof-image-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        write_image(&dir.join("c.svg"), SVG).unwrap();
        assert_eq!(std::fs::read_to_string(dir.join("c.svg")).unwrap(), SVG);
        write_image(&dir.join("c.png"), SVG).unwrap();
        assert!(std::fs::read(dir.join("c.png"))
            .unwrap()
            .starts_with(b"\x89PNG"));
        let e = write_image(&dir.join("missing/c.png"), SVG).unwrap_err();
        assert!(matches!(e, ImageError::Write { .. }), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn invalid_svg_is_an_error_not_a_blank_picture() {
        assert!(matches!(svg_to_png("<svg"), Err(ImageError::Svg(_))));
    }
}
