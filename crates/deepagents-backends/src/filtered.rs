//! Searching through a filter without coming up short.

use crate::protocol::{Backend, BackendContext, BackendError, GrepMatch, GrepQuery, GrepResult};

/// How much the cap grows each time filtered-out matches used up too much of it.
const GROWTH: usize = 4;

/// Searches after which the cap is lifted altogether, bounding the repeated work.
const CAPPED_SEARCHES: usize = 4;

/// Greps `backend` and keeps the matches `keep` accepts, up to `query.max_count` of them.
///
/// The backend cuts its matches at the cap before they are filtered here, so filtering a single
/// answer would come up short whenever rejected matches took part of the cap. When that happens
/// the search runs again with a larger cap. `truncated` is set when the backend stopped early
/// (so more may exist) or more kept matches were found than the cap allows.
pub(crate) async fn grep_kept(
    backend: &dyn Backend,
    cx: &BackendContext,
    query: &GrepQuery,
    keep: &(dyn Fn(&GrepMatch) -> bool + Sync),
) -> Result<GrepResult, BackendError> {
    let wanted = query.max_count;
    let mut asked = wanted;
    let mut searches = 0;
    loop {
        let found = backend
            .grep(
                cx,
                &GrepQuery {
                    max_count: asked,
                    ..query.clone()
                },
            )
            .await?;
        // Fewer matches than asked with `truncated` means a time budget ran out: searching
        // again would only run out again.
        let cut_at_cap = found.truncated && found.matches.len() >= asked;
        let mut kept: Vec<GrepMatch> = found.matches.into_iter().filter(|m| keep(m)).collect();
        if kept.len() >= wanted || !cut_at_cap || asked == usize::MAX {
            let truncated = found.truncated || kept.len() > wanted;
            kept.truncate(wanted);
            // Skipped files are named by path like matches, and pass the same filter.
            let skipped = found
                .skipped
                .into_iter()
                .filter(|s| {
                    keep(&GrepMatch {
                        path: s.path.clone(),
                        line_number: 0,
                        line: String::new(),
                    })
                })
                .collect();
            let mut result = GrepResult {
                matches: kept,
                truncated,
                skipped,
            };
            result.trim_skipped(wanted);
            return Ok(result);
        }
        searches += 1;
        asked = if searches >= CAPPED_SEARCHES {
            usize::MAX
        } else {
            asked.saturating_mul(GROWTH)
        };
    }
}
