"""Analysis: the capacity views and failure-point rules, the rank bound, stalls, intervals,
scaling, prediction, the published values, the report and its figures. It reads stores; it
never imports training."""
