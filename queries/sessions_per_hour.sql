-- Sessions per hour of their end with their mean length and the share that bought something,
-- from gold.sessions: the traffic panel of a BI dashboard. `final` is false for the hours
-- after gold.sessions' complete-through mark (ops.completeness): sessions may still close
-- in them, so their figures are provisional.
SELECT
  DATE_TRUNC('HOUR', session_end) AS hour_start,
  COUNT(*) AS sessions,
  ROUND(AVG((UNIX_SECONDS(session_end) - UNIX_SECONDS(session_start)) / 60), 1) AS mean_minutes,
  ROUND(AVG(CASE WHEN purchases > 0 THEN 1 ELSE 0 END), 3) AS buying_share,
  ROUND(SUM(revenue), 2) AS revenue,
  COALESCE(
    DATE_TRUNC('HOUR', session_end) + INTERVAL 1 HOUR
      <= (SELECT MAX(complete_through) FROM ops.completeness WHERE `table` = 'gold.sessions'),
    false
  ) AS final
FROM gold.sessions
GROUP BY 1
ORDER BY 1
