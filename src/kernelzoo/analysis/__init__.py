"""Analysis: the rules that turn a store's runs into failure points, intervals, the rank bound,
stalls, the d_dot law, rankings and the published comparison; ``pipeline.analyse`` reads a store
once and returns them as one record. It never imports training, and draws or writes nothing."""
