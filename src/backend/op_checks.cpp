#include "backend/op_checks.h"

#include "core/error.h"

namespace kiln {

void check_attention_shapes(std::string_view op, const Tensor& q, const KvLayer& cache, const BatchIndex& batch,
                            const AttentionParams& p, const Tensor& out) {
  KILN_CHECK(p.n_head > 0 && p.n_head_kv > 0 && p.n_head % p.n_head_kv == 0,
             "{}: {} query heads cannot share {} kv heads", op, p.n_head, p.n_head_kv);
  KILN_CHECK(q.ne[0] == int64_t(p.n_head) * p.head_dim_k && out.ne[0] == int64_t(p.n_head) * p.head_dim_v &&
                 out.ne[1] == q.ne[1],
             "{}: q {} / out {} do not fit {} heads of {} / {}", op, q.describe(), out.describe(), p.n_head,
             p.head_dim_k, p.head_dim_v);
  KILN_CHECK(cache.k.ne[0] == int64_t(p.n_head_kv) * p.head_dim_k &&
                 cache.v.ne[0] == int64_t(p.n_head_kv) * p.head_dim_v,
             "{}: cache rows {} / {} do not fit {} kv heads", op, cache.k.ne[0], cache.v.ne[0], p.n_head_kv);
  KILN_CHECK(batch.positions.elements() == q.ne[1] && batch.seq_rows.elements() == q.ne[1],
             "{}: batch index describes {} tokens, q has {}", op, batch.positions.elements(), q.ne[1]);
  if (p.sinks)
    KILN_CHECK(p.sinks->elements() == p.n_head, "{}: {} sinks for {} heads", op, p.sinks->elements(), p.n_head);
}

}  // namespace kiln
