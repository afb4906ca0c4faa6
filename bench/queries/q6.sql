-- TPC-H Q6 (forecasting revenue change), DATE = 1994-01-01, DISCOUNT = 0.06, QUANTITY = 24, over
-- silver.lineitem. The discount bounds are written as their values (0.05, 0.07), not as
-- 0.06 - 0.01: DataFusion reads such literals as floats, where 0.06 + 0.01 < 0.07.
SELECT sum(l_extendedprice * l_discount) AS revenue
FROM lineitem
WHERE l_shipdate >= DATE '1994-01-01'
  AND l_shipdate < DATE '1994-01-01' + INTERVAL '1' YEAR
  AND l_discount BETWEEN 0.05 AND 0.07
  AND l_quantity < 24
