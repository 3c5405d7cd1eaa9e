//! Backend wrappers without hand-written forwarding.

/// Implements [`Backend`](crate::Backend) for a wrapper: the methods named in `forward` only
/// pass the call on, unchanged, to the backend the expression after `to` gives; the methods
/// written out below it are taken as they are.
///
/// ```text
/// delegate_backend! {
///     impl Backend for Wrapper {
///         forward [ls, read, read_raw] to |self, cx| self.inner;
///
///         fn name(&self) -> &'static str { "wrapper" }
///         // ...every other method
///     }
/// }
/// ```
///
/// `self` and `cx` name the receiver and the call's [`BackendContext`](crate::BackendContext)
/// in the expression, which is evaluated once per call and may `.await` and, in methods
/// returning a `Result`, use `?` (`self.instance(cx).await?`). Every method taking a context
/// can be forwarded; `name`, `as_sandbox` and `path_mappings` are written out (or left to the
/// trait's defaults). The result is an `#[async_trait]` impl, as if written by hand.
macro_rules! delegate_backend {
    (
        impl Backend for $ty:ty {
            forward [$($method:ident),+ $(,)?] to |$this:ident, $cx:ident| $target:expr;
            $($rest:tt)*
        }
    ) => {
        $crate::delegate::delegate_backend!(
            @next ($ty) ($this $cx $target) [$($method)+] [] [$($rest)*]
        );
    };

    // One forwarded method at a time, by its signature in the trait (without `self` and the
    // context); the methods are gathered in `$done` and put in one impl at the end, since
    // `#[async_trait]` has to see them all at once.
    (@next $ty:tt $to:tt [ls $($more:ident)*] $done:tt $rest:tt) => {
        $crate::delegate::delegate_backend!(@method $ty $to [$($more)*] $done $rest
            ls(path: &$crate::VPath) -> Result<Vec<$crate::FileInfo>, $crate::BackendError>);
    };
    (@next $ty:tt $to:tt [read $($more:ident)*] $done:tt $rest:tt) => {
        $crate::delegate::delegate_backend!(@method $ty $to [$($more)*] $done $rest
            read(path: &$crate::VPath, offset: usize, limit: usize)
                -> Result<$crate::ReadResult, $crate::BackendError>);
    };
    (@next $ty:tt $to:tt [read_raw $($more:ident)*] $done:tt $rest:tt) => {
        $crate::delegate::delegate_backend!(@method $ty $to [$($more)*] $done $rest
            read_raw(path: &$crate::VPath) -> Result<$crate::RawFile, $crate::BackendError>);
    };
    (@next $ty:tt $to:tt [write $($more:ident)*] $done:tt $rest:tt) => {
        $crate::delegate::delegate_backend!(@method $ty $to [$($more)*] $done $rest
            write(path: &$crate::VPath, content: &str)
                -> Result<$crate::Changed<()>, $crate::BackendError>);
    };
    (@next $ty:tt $to:tt [overwrite $($more:ident)*] $done:tt $rest:tt) => {
        $crate::delegate::delegate_backend!(@method $ty $to [$($more)*] $done $rest
            overwrite(path: &$crate::VPath, content: &str)
                -> Result<$crate::Changed<()>, $crate::BackendError>);
    };
    (@next $ty:tt $to:tt [edit $($more:ident)*] $done:tt $rest:tt) => {
        $crate::delegate::delegate_backend!(@method $ty $to [$($more)*] $done $rest
            edit(path: &$crate::VPath, old: &str, new: &str, replace_all: bool)
                -> Result<$crate::Changed<usize>, $crate::BackendError>);
    };
    (@next $ty:tt $to:tt [delete $($more:ident)*] $done:tt $rest:tt) => {
        $crate::delegate::delegate_backend!(@method $ty $to [$($more)*] $done $rest
            delete(path: &$crate::VPath) -> Result<$crate::Changed<usize>, $crate::BackendError>);
    };
    (@next $ty:tt $to:tt [glob $($more:ident)*] $done:tt $rest:tt) => {
        $crate::delegate::delegate_backend!(@method $ty $to [$($more)*] $done $rest
            glob(pattern: &str, base: &$crate::VPath)
                -> Result<$crate::GlobResult, $crate::BackendError>);
    };
    (@next $ty:tt $to:tt [grep $($more:ident)*] $done:tt $rest:tt) => {
        $crate::delegate::delegate_backend!(@method $ty $to [$($more)*] $done $rest
            grep(query: &$crate::GrepQuery) -> Result<$crate::GrepResult, $crate::BackendError>);
    };
    (@next $ty:tt $to:tt [upload_files $($more:ident)*] $done:tt $rest:tt) => {
        $crate::delegate::delegate_backend!(@method $ty $to [$($more)*] $done $rest
            upload_files(files: Vec<(String, Vec<u8>)>)
                -> $crate::Changed<Vec<Result<(), $crate::FileOpError>>>);
    };
    (@next $ty:tt $to:tt [download_files $($more:ident)*] $done:tt $rest:tt) => {
        $crate::delegate::delegate_backend!(@method $ty $to [$($more)*] $done $rest
            download_files(paths: Vec<String>) -> Vec<Result<Vec<u8>, $crate::FileOpError>>);
    };
    (@next ($ty:ty) $to:tt [] [$($done:tt)*] [$($rest:tt)*]) => {
        #[::async_trait::async_trait]
        impl $crate::Backend for $ty {
            $($done)*
            $($rest)*
        }
    };

    (@method $ty:tt ($this:ident $cx:ident $target:expr) $more:tt [$($done:tt)*] $rest:tt
        $name:ident($($arg:ident: $arg_ty:ty),*) -> $ret:ty
    ) => {
        $crate::delegate::delegate_backend!(@next $ty ($this $cx $target) $more [
            $($done)*
            async fn $name(&$this, $cx: &$crate::BackendContext, $($arg: $arg_ty),*) -> $ret {
                $target.$name($cx, $($arg),*).await
            }
        ] $rest);
    };
}

pub(crate) use delegate_backend;
