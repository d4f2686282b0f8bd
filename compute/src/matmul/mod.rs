//! A bounds-checked front for the `gemm` crate's matrix product, for weft's CPU kernels.

/// A matrix over a slice: element `(i, j)` is `data[i * row_stride + j * col_stride]`.
#[derive(Clone, Copy)]
pub(crate) struct View<'a> {
    /// The elements.
    pub data: &'a [f32],
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    /// Distance between rows.
    pub row_stride: usize,
    /// Distance between columns.
    pub col_stride: usize,
}

impl<'a> View<'a> {
    /// A row-major `rows × cols` matrix.
    pub(crate) fn rows(data: &'a [f32], rows: usize, cols: usize) -> Self {
        View {
            data,
            rows,
            cols,
            row_stride: cols,
            col_stride: 1,
        }
    }

    /// The transpose, without moving data.
    pub(crate) fn t(self) -> Self {
        View {
            rows: self.cols,
            cols: self.rows,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
            ..self
        }
    }

    /// Whether every element lies inside `data`.
    fn fits(&self) -> bool {
        self.rows == 0
            || self.cols == 0
            || (self.rows - 1) * self.row_stride + (self.cols - 1) * self.col_stride < self.data.len()
    }
}

/// `dst = scale · lhs · rhs`, plus `dst`'s previous contents when `accumulate`; `dst` is
/// row-major `lhs.rows × rhs.cols` with rows `dst_row_stride` apart (at least `rhs.cols`). `parallel` spreads the product over rayon's pool (leave
/// it off when the caller is already one of many parallel tasks).
///
/// # Panics
/// If the shapes do not chain or a view reaches outside its slice: callers check their
/// inputs' shapes first and return errors.
pub(crate) fn matmul(
    dst: &mut [f32],
    dst_row_stride: usize,
    lhs: View<'_>,
    rhs: View<'_>,
    scale: f32,
    accumulate: bool,
    parallel: bool,
) {
    let (m, k, n) = (lhs.rows, lhs.cols, rhs.cols);
    assert_eq!(rhs.rows, k, "matmul: inner dimensions differ");
    if m == 0 || n == 0 {
        return;
    }
    assert!(
        dst_row_stride >= n && dst.len() > (m - 1) * dst_row_stride + n - 1 && lhs.fits() && rhs.fits(),
        "matmul: a view reaches outside its slice"
    );
    let parallelism = if parallel {
        gemm::Parallelism::Rayon(rayon::current_num_threads())
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: the assertions above keep every element the strides and sizes address inside
    // its slice; `dst` is exclusively borrowed and does not overlap the shared inputs.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            dst_row_stride as isize,
            accumulate,
            lhs.data.as_ptr(),
            lhs.col_stride as isize,
            lhs.row_stride as isize,
            rhs.data.as_ptr(),
            rhs.col_stride as isize,
            rhs.row_stride as isize,
            1.0,
            scale,
            false,
            false,
            false,
            parallelism,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn products_with_transposes_and_accumulation() {
        // a: 2x3, b: 3x2 (given as its 2x3 transpose).
        let a = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let bt = [7.0, 9.0, 11.0, 8.0, 10.0, 12.0];
        let mut dst = [1.0; 4];
        matmul(
            &mut dst,
            2,
            View::rows(&a, 2, 3),
            View::rows(&bt, 2, 3).t(),
            1.0,
            true,
            false,
        );
        assert_eq!(dst, [59.0, 65.0, 140.0, 155.0]);
        matmul(
            &mut dst,
            2,
            View::rows(&a, 2, 3),
            View::rows(&bt, 2, 3).t(),
            0.5,
            false,
            true,
        );
        assert_eq!(dst, [29.0, 32.0, 69.5, 77.0]);
        // Into every other column of a wider destination.
        let mut wide = [0.0; 8];
        matmul(
            &mut wide,
            4,
            View::rows(&a, 2, 3),
            View::rows(&bt, 2, 3).t(),
            1.0,
            false,
            false,
        );
        assert_eq!(wide, [58.0, 64.0, 0.0, 0.0, 139.0, 154.0, 0.0, 0.0]);
    }

    #[test]
    #[should_panic(expected = "outside")]
    fn a_view_past_its_slice_panics_instead_of_reading_it() {
        let a = [1.0; 5];
        let mut dst = [0.0; 4];
        matmul(
            &mut dst,
            2,
            View::rows(&a, 2, 3),
            View::rows(&a, 3, 2),
            1.0,
            false,
            false,
        );
    }
}
