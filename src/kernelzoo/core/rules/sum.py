"""The sum rule: W <- W + v_l phi(k_l)^T (reference §1.2, §2.1; task spec "sum update rule").

Its production read never forms phi for training (``by_scores``): the model scatter-adds the
scores phi(q) . phi(k_l) (``FeatureMap.scores``) into the value slots, and the memory estimate
counts that path (``training.footprint``). ``read`` here is the path ``memory.read`` takes for
features already formed, in the cheaper contraction order.
"""

from kernelzoo.core.rules.base import UpdateRule


class Sum(UpdateRule):
    name = "sum"
    by_scores = True

    def step(self, W, k_l, v_l, beta_l, alpha_l, l):
        return W + v_l[:, :, None] * k_l[:, None, :]

    def read(self, k, v, q, beta, alpha, chunk_size):
        """y = phi(Q) W^T with W = V^T phi(K): scores phi(K) phi(Q)^T then scores^T V costs
        L Q (D + d_v); forming W costs D d_v (L + Q), which wins when Q is large."""
        L, D, Q, d_v = k.shape[1], k.shape[2], q.shape[1], v.shape[-1]
        if L * Q * (D + d_v) <= D * d_v * (L + Q):
            return (q @ k.transpose(1, 2)) @ v
        return q @ (v.transpose(1, 2) @ k).transpose(1, 2)

    def flushes_denormals(self, training, normalisation):
        return training and not self.divides_by_feature_sum(normalisation)


RULE = Sum()
