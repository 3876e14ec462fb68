-- Sessions started per hour with their mean length and the share that bought something,
-- from gold.sessions: the traffic panel of a BI dashboard.
SELECT
  DATE_TRUNC('HOUR', session_start) AS hour_start,
  COUNT(*) AS sessions,
  ROUND(AVG((UNIX_SECONDS(session_end) - UNIX_SECONDS(session_start)) / 60), 1) AS mean_minutes,
  ROUND(AVG(CASE WHEN purchases > 0 THEN 1 ELSE 0 END), 3) AS buying_share,
  ROUND(SUM(revenue), 2) AS revenue
FROM gold.sessions
GROUP BY 1
ORDER BY 1
