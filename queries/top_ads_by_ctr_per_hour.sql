-- The three ads with the highest click-through rate in each hour (at least 2 impressions),
-- from gold.ad_performance_hourly_final: the hours whose rows are final (before the table's
-- complete-through mark in ops.completeness), what a campaign dashboard shows.
SELECT hour_start, ad_id, impressions, clicks, ROUND(click_through_rate, 4) AS ctr, rank
FROM (
  SELECT *, RANK() OVER (PARTITION BY hour_start ORDER BY click_through_rate DESC, ad_id) AS rank
  FROM gold.ad_performance_hourly_final
  WHERE impressions >= 2
)
WHERE rank <= 3
ORDER BY hour_start, rank
