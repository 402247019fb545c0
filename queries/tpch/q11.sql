-- TPC-H Q11 (important stock identification): grouped aggregate filtered by HAVING against an uncorrelated scalar subquery.
-- FRACTION is 0.0001 / SF (TPC-H 2.4.11.3); SF is the supplier table's rows / 10000, so the query
-- returns rows at every scale factor. Ties in value are ordered by ps_partkey, so that the order is
-- one answer and any two engines can be compared row by row (at SF 10, 4 rows tie).
select
    ps_partkey,
    sum(ps_supplycost * ps_availqty) as value
from partsupp, supplier, nation
where ps_suppkey = s_suppkey
  and s_nationkey = n_nationkey
  and n_name = 'GERMANY'
group by ps_partkey
having sum(ps_supplycost * ps_availqty) > (
    select sum(ps_supplycost * ps_availqty) * 0.0001 / ((select count(*) from supplier) / 10000.0)
    from partsupp, supplier, nation
    where ps_suppkey = s_suppkey
      and s_nationkey = n_nationkey
      and n_name = 'GERMANY')
order by value desc, ps_partkey;
